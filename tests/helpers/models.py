"""Models used across the tests."""

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
