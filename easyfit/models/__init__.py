"""Pretrained-ready models: ResNet v1.5 and ViT as NNX modules with timm's variant names, and
``load_weights`` for timm, torchvision and Hugging Face safetensors files.

Example:
    >>> import easyfit as ef
    >>> model = ef.models.create_model("resnet18", num_classes=10, width=8)
    >>> type(model).__name__, model.fc.kernel.shape
    ('ResNet', (64, 10))
"""

from __future__ import annotations

import os
from typing import Any

from flax import nnx

from .adapters import load_adapters, save_adapters
from .finetune import add_lora, merge_lora, trainable
from .resnet import ResNet
from .vit import ViT
from .weights import Preprocessing, load_weights, model_config

__all__ = [
    "Preprocessing",
    "ResNet",
    "ViT",
    "add_lora",
    "create_model",
    "load_adapters",
    "load_weights",
    "merge_lora",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "save_adapters",
    "trainable",
    "vit_base_patch16_224",
    "vit_large_patch16_224",
    "vit_small_patch16_224",
]

_RESNETS = {"resnet18": ([2, 2, 2, 2], False), "resnet34": ([3, 4, 6, 3], False)}
_RESNETS |= {"resnet50": ([3, 4, 6, 3], True), "resnet101": ([3, 4, 23, 3], True)}
_VITS = {
    "vit_small_patch16_224": (384, 12, 6),
    "vit_base_patch16_224": (768, 12, 12),
    "vit_large_patch16_224": (1024, 24, 16),
}


def create_model(
    name: str,
    num_classes: int = 1000,
    *,
    weights: str | os.PathLike | None = None,
    layout: str = "timm",
    dtype: Any = None,
    rngs: nnx.Rngs | None = None,
    **kwargs: Any,
) -> nnx.Module:
    """A model by timm's name (``"resnet50"``, ``"vit_base_patch16_224"``), as
    ``timm.create_model(name, num_classes=...)``.

    Args:
        name: One of ``resnet18``, ``resnet34``, ``resnet50``, ``resnet101``,
            ``vit_small_patch16_224``, ``vit_base_patch16_224``, ``vit_large_patch16_224``.
        num_classes: Outputs of the head; a head of another size in ``weights`` is left out
            (the model keeps a fresh one).
        weights: A safetensors file or a folder holding ``model.safetensors``, loaded by
            ``load_weights``.
        layout: Whose key names ``weights`` uses: ``"timm"``, ``"torchvision"``, ``"hf"``.
        dtype: The dtype the passes compute in (``jnp.bfloat16`` on GPUs).
        rngs: Where the initial weights are drawn from (``nnx.Rngs(0)`` when None).
        **kwargs: Passed on to ``ResNet`` or ``ViT`` (``width``, ``image_size``, ...).

    Returns:
        The model, a ``ResNet`` or a ``ViT``.
    """
    model: nnx.Module
    if name in _RESNETS:
        stages, bottleneck = _RESNETS[name]
        model = ResNet(
            stages, bottleneck=bottleneck, num_classes=num_classes, dtype=dtype, rngs=rngs, **kwargs
        )
    elif name in _VITS:
        dim, depth, heads = _VITS[name]
        eps = model_config(weights).get("layer_norm_eps") if weights is not None else None
        if eps is not None:  # Hugging Face's ViT: 1e-12
            kwargs.setdefault("norm_eps", float(eps))
        model = ViT(dim, depth, heads, num_classes=num_classes, dtype=dtype, rngs=rngs, **kwargs)
    else:
        raise ValueError(f"model {name!r}: expected one of {sorted(_RESNETS) + sorted(_VITS)}")
    if weights is not None:
        load_weights(model, weights, layout)
    return model


def _named(name: str) -> Any:
    def make(num_classes: int = 1000, **kwargs: Any) -> nnx.Module:
        return create_model(name, num_classes, **kwargs)

    make.__name__ = make.__qualname__ = name
    make.__doc__ = f"""``create_model("{name}", num_classes, **kwargs)``: timm's ``{name}``.

    Args:
        num_classes: Outputs of the head.
        **kwargs: ``create_model``'s (``weights``, ``layout``, ``dtype``, ...).

    Returns:
        The model.
    """
    return make


resnet18 = _named("resnet18")
resnet34 = _named("resnet34")
resnet50 = _named("resnet50")
resnet101 = _named("resnet101")
vit_small_patch16_224 = _named("vit_small_patch16_224")
vit_base_patch16_224 = _named("vit_base_patch16_224")
vit_large_patch16_224 = _named("vit_large_patch16_224")
