"""Models used across the tests."""

import jax
from flax import linen as nn
from flax import nnx


class MLP(nn.Module):
    """Reference program 1's MLP (widths configurable to keep tests fast)."""

    widths: tuple[int, ...] = (784, 1024, 1024)

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        for width in self.widths:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(10)(x)


class SmallMLP(MLP):
    widths: tuple[int, ...] = (128,)


class TinyMLP(nn.Module):
    """Few parameters, quick to compile: for tests about the updates, not the model."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(16)(x.reshape((x.shape[0], -1)))))


class NNXMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(784, 128, rngs=rngs)
        self.out = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        return self.out(nnx.relu(self.hidden(x)))


class NormedCNN(nn.Module):
    """Conv + BatchNorm + Dense: batch statistics (float32 under every precision, global across
    devices)."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(8, (3, 3), strides=(2, 2))(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
        return nn.Dense(10)(x.reshape((x.shape[0], -1)))


class RegularisedCNN(nn.Module):
    """Conv + BatchNorm + Dropout + Dense, tiny: a linen model with both kinds of model state
    (batch statistics, a dropout key each step)."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(4, (3, 3), strides=(4, 4))(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train)(x)).reshape((x.shape[0], -1))
        return nn.Dense(10)(nn.Dropout(0.2, deterministic=not train)(x))


class NNXRegularised(nnx.Module):
    """docs/models.md's NNX model, narrower (BatchNorm statistics; a Dropout with its own
    ``nnx.Rngs`` stream), which also keeps the ``nnx.Rngs`` it was built with and draws noise
    from it in ``__call__``, as Flax's NNX tutorials do: typed PRNG keys and counts in the
    model state, two ways."""

    def __init__(self, rngs: nnx.Rngs):
        self.rngs = rngs
        self.hidden = nnx.Linear(784, 8, rngs=rngs)
        self.norm = nnx.BatchNorm(8, rngs=rngs)
        self.dropout = nnx.Dropout(0.2, rngs=rngs)
        self.out = nnx.Linear(8, 10, rngs=rngs)

    def __call__(self, x):
        x = self.norm(self.hidden(x.reshape((x.shape[0], -1))))
        noise = 0.01 * jax.random.normal(self.rngs.noise(), x.shape)
        return self.out(self.dropout(nnx.relu(x + noise.astype(x.dtype))))
