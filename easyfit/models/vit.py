"""The Vision Transformer (ViT) as an NNX module, NHWC, with timm's attribute names
(``patch_embed.proj``, ``blocks[i].attn.qkv``, ``norm``, ``head``), so timm's weights map onto
it by renaming leaves and transposing kernels: see ``load_weights``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["ViT"]

_List: Any = getattr(nnx, "List", list)
_init = nnx.initializers.truncated_normal(0.02)


class _PatchEmbed(nnx.Module):
    def __init__(self, patch: int, cin: int, dim: int, dtype: Any, rngs: nnx.Rngs):
        self.proj = nnx.Conv(
            cin, dim, (patch, patch), strides=(patch, patch), padding="VALID", dtype=dtype, rngs=rngs
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.proj(x)
        return y.reshape(y.shape[0], -1, y.shape[-1])


class _Attention(nnx.Module):
    def __init__(self, dim: int, heads: int, dtype: Any, rngs: nnx.Rngs):
        self.heads = heads
        self.qkv = nnx.Linear(dim, 3 * dim, dtype=dtype, kernel_init=_init, rngs=rngs)
        self.proj = nnx.Linear(dim, dim, dtype=dtype, kernel_init=_init, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads)  # timm's order
        y = jax.nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
        return self.proj(y.reshape(b, n, d))


class _Mlp(nnx.Module):
    def __init__(self, dim: int, hidden: int, dtype: Any, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(dim, hidden, dtype=dtype, kernel_init=_init, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, dim, dtype=dtype, kernel_init=_init, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


class _Block(nnx.Module):
    def __init__(self, dim: int, heads: int, eps: float, dtype: Any, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(dim, epsilon=eps, dtype=dtype, rngs=rngs)
        self.attn = _Attention(dim, heads, dtype, rngs)
        self.norm2 = nnx.LayerNorm(dim, epsilon=eps, dtype=dtype, rngs=rngs)
        self.mlp = _Mlp(dim, 4 * dim, dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nnx.Module):
    """A ViT on NHWC images (class token, learned position embeddings, pre-norm blocks);
    returns float32 logits from the class token.

    An NNX module, as ``ResNet`` (its docstring says why).

    Args:
        dim: Width of the tokens (384 for ViT-S, 768 for ViT-B, 1024 for ViT-L).
        depth: Blocks.
        heads: Attention heads.
        num_classes: Outputs of the head, ``head``.
        image_size: Side of the square images the position embeddings are for.
        patch_size: Side of the square patches.
        in_channels: Channels of the input images.
        norm_eps: LayerNorm's epsilon (timm's 1e-6; Hugging Face's ViT uses 1e-12).
        dtype: The dtype the passes compute in (``jnp.bfloat16`` on GPUs); the weights stay
            float32.
        rngs: Where the initial weights are drawn from (``nnx.Rngs(0)`` when None).

    Example:
        >>> import easyfit as ef
        >>> model = ef.models.ViT(dim=32, depth=1, heads=2, num_classes=3, image_size=32)
        >>> model.pos_embed.shape, model.head.kernel.shape  # 2 x 2 patches of 16, the class token
        ((1, 5, 32), (32, 3))
    """

    def __init__(
        self,
        dim: int = 768,
        depth: int = 12,
        heads: int = 12,
        *,
        num_classes: int = 1000,
        image_size: int = 224,
        patch_size: int = 16,
        in_channels: int = 3,
        norm_eps: float = 1e-6,
        dtype: Any = None,
        rngs: nnx.Rngs | None = None,
    ):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.num_classes = num_classes
        self.dtype = dtype
        tokens = (image_size // patch_size) ** 2 + 1
        self.patch_embed = _PatchEmbed(patch_size, in_channels, dim, dtype, rngs)
        self.cls_token = nnx.Param(nnx.initializers.normal(1e-6)(rngs.params(), (1, 1, dim)))
        self.pos_embed = nnx.Param(_init(rngs.params(), (1, tokens, dim)))
        self.blocks = _List([_Block(dim, heads, norm_eps, dtype, rngs) for _ in range(depth)])
        self.norm = nnx.LayerNorm(dim, epsilon=norm_eps, dtype=dtype, rngs=rngs)
        self.head = nnx.Linear(dim, num_classes, dtype=dtype, rngs=rngs)

    def features(self, x: jax.Array) -> jax.Array:
        """The normalised class token the head reads: ``(batch, dim)``."""
        x = self.patch_embed(x)
        cls = jnp.broadcast_to(self.cls_token[...], (x.shape[0], 1, x.shape[-1])).astype(x.dtype)
        x = jnp.concatenate([cls, x], axis=1) + self.pos_embed[...].astype(x.dtype)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)[:, 0]

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.features(x)).astype(jnp.float32)
