"""ResNet v1.5 (the stride on the 3x3 convolution of a bottleneck) as an NNX module, NHWC.

The attribute names are those of torchvision's and timm's ResNet (``conv1``, ``bn1``,
``layer1[0].conv2``, ``downsample[0]``, ``fc``), so their weights map onto it by renaming a few
leaves (``weight`` to ``kernel`` or ``scale``) and transposing kernels: see ``load_weights``.
Padding is explicit and equal to PyTorch's, so the same weights give the same logits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["ResNet"]

_List: Any = getattr(nnx, "List", list)  # nnx.List holds submodules in Flax 0.12


def _kernel_init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
    """torchvision's initialisation of a convolution: He-normal over the fan-out, the values of
    ``nnx.initializers.variance_scaling(2.0, "fan_out", "normal")``. JAX draws the same flat
    bits whatever the shape, so the draw is made flat and reshaped: XLA compiles a draw of a
    4-D shape many times slower, and a model built eagerly compiles one per kernel shape."""
    fan_out = math.prod(shape[:-2]) * shape[-1]
    flat = jax.random.normal(key, (math.prod(shape),), dtype).reshape(tuple(shape))
    return flat * jnp.sqrt(jnp.array(2.0 / fan_out, dtype))


def _conv(cin: int, cout: int, k: int, stride: int, dtype: Any, rngs: nnx.Rngs) -> nnx.Conv:
    pad = (k - 1) // 2  # PyTorch's padding, also for a stride of 2 (not "SAME")
    return nnx.Conv(
        cin,
        cout,
        (k, k),
        strides=(stride, stride),
        padding=((pad, pad), (pad, pad)),
        use_bias=False,
        dtype=dtype,
        kernel_init=_kernel_init,
        rngs=rngs,
    )


class BatchNorm(nnx.BatchNorm):
    """``nnx.BatchNorm`` that stays in inference mode once ``frozen`` (set by ``trainable``
    when its parameters are frozen), whatever ``model.train()`` says, and returns its input's
    dtype unless given one."""

    frozen = False

    def __call__(self, x: jax.Array, use_running_average: bool | None = None, **kwargs: Any) -> jax.Array:
        y = super().__call__(x, use_running_average=True if self.frozen else use_running_average, **kwargs)
        # with no dtype set, the passes stay in the input's (float32 statistics would promote
        # bfloat16 activations to float32 for the rest of the network)
        return y if self.dtype is not None else y.astype(x.dtype)


def _norm(c: int, dtype: Any, rngs: nnx.Rngs, zero: bool = False) -> nnx.BatchNorm:
    init = nnx.initializers.zeros if zero else nnx.initializers.ones
    # Flax's momentum 0.9 is PyTorch's 0.1; epsilon as PyTorch's
    return BatchNorm(c, momentum=0.9, epsilon=1e-5, dtype=dtype, scale_init=init, rngs=rngs)


class _Block(nnx.Module):
    """Two 3x3 convolutions (basic), or 1x1-3x3-1x1 with the stride on the 3x3 (bottleneck)."""

    def __init__(
        self, cin: int, width: int, stride: int, bottleneck: bool, zero: bool, dtype: Any, rngs: nnx.Rngs
    ):
        out = width * 4 if bottleneck else width
        if bottleneck:
            self.conv1 = _conv(cin, width, 1, 1, dtype, rngs)
            self.bn1 = _norm(width, dtype, rngs)
            self.conv2 = _conv(width, width, 3, stride, dtype, rngs)
            self.bn2 = _norm(width, dtype, rngs)
            self.conv3 = _conv(width, out, 1, 1, dtype, rngs)
            self.bn3 = _norm(out, dtype, rngs, zero)
        else:
            self.conv1 = _conv(cin, width, 3, stride, dtype, rngs)
            self.bn1 = _norm(width, dtype, rngs)
            self.conv2 = _conv(width, width, 3, 1, dtype, rngs)
            self.bn2 = _norm(width, dtype, rngs, zero)
        self.bottleneck = bottleneck
        self.downsample = (
            _List([_conv(cin, out, 1, stride, dtype, rngs), _norm(out, dtype, rngs)])
            if stride != 1 or cin != out
            else None
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.bottleneck:
            y = self.bn3(self.conv3(nnx.relu(y)))
        if self.downsample is not None:
            x = self.downsample[1](self.downsample[0](x))
        return nnx.relu(x + y)


class ResNet(nnx.Module):
    """ResNet v1.5 on NHWC images; returns float32 logits.

    An NNX module rather than linen because it holds its weights: ``load_weights`` fills the
    module in place and ``Trainer(model)`` trains from them, with no initial parameters to pass
    beside the model (easyfit takes linen modules too, for models of your own).

    Args:
        stage_sizes: Blocks per stage (``[3, 4, 6, 3]`` for ResNet-50).
        bottleneck: Bottleneck blocks (ResNet-50 and deeper) or basic ones (ResNet-18/34).
        num_classes: Outputs of the head, ``fc``.
        width: Channels of the first stage (64); narrower for tiny tests.
        in_channels: Channels of the input images.
        zero_init_residual: Start the last BatchNorm scale of each block at zero, so each
            block starts as the identity (the ImageNet recipe from scratch).
        dtype: The dtype the passes compute in (``jnp.bfloat16`` on GPUs); the weights stay
            float32.
        rngs: Where the initial weights are drawn from (``nnx.Rngs(0)`` when None).

    Example:
        >>> import jax.numpy as jnp
        >>> import easyfit as ef
        >>> model = ef.models.ResNet([1, 1], bottleneck=False, num_classes=3, width=8)
        >>> model(jnp.zeros((2, 32, 32, 3))).shape
        (2, 3)
    """

    def __init__(
        self,
        stage_sizes: Sequence[int],
        *,
        bottleneck: bool = True,
        num_classes: int = 1000,
        width: int = 64,
        in_channels: int = 3,
        zero_init_residual: bool = True,
        dtype: Any = None,
        rngs: nnx.Rngs | None = None,
    ):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.num_classes = num_classes
        self.conv1 = nnx.Conv(
            in_channels,
            width,
            (7, 7),
            strides=(2, 2),
            padding=((3, 3), (3, 3)),
            use_bias=False,
            dtype=dtype,
            kernel_init=_kernel_init,
            rngs=rngs,
        )
        self.bn1 = _norm(width, dtype, rngs)
        cin = width
        self.stages = len(stage_sizes)
        for i, blocks in enumerate(stage_sizes):
            layer = []
            for j in range(blocks):
                stride = 2 if i > 0 and j == 0 else 1
                block = _Block(cin, width * 2**i, stride, bottleneck, zero_init_residual, dtype, rngs)
                cin = width * 2**i * (4 if bottleneck else 1)
                layer.append(block)
            setattr(self, f"layer{i + 1}", _List(layer))
        self.fc = nnx.Linear(cin, num_classes, dtype=dtype, rngs=rngs)

    def features(self, x: jax.Array) -> jax.Array:
        """The pooled features the head reads: ``(batch, channels)``."""
        x = nnx.relu(self.bn1(self.conv1(x)))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))  # as PyTorch's
        for i in range(self.stages):
            for block in getattr(self, f"layer{i + 1}"):
                x = block(x)
        return jnp.mean(x, axis=(1, 2))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc(self.features(x)).astype(jnp.float32)
