"""Fine-tuning: which parameters train, with which optimizer, as one optax transformation.

``trainable(model, optimizer, "head")`` gives an ``optax.multi_transform`` that applies
``optimizer`` to the chosen parameters and ``optax.set_to_zero()`` to the rest, so frozen
parameters get no optimizer state (no momentum, no Adam moments) and never move. It goes to
the Trainer through its ``optimizer`` argument, like any optax transformation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

__all__ = ["add_lora", "merge_lora", "parameter_path", "trainable"]

FROZEN = "frozen"


def parameter_path(key_path: Sequence[Any]) -> str:
    """A parameter's path as ``trainable`` and its error messages spell it: the keys joined by
    ``/`` (``layer4/0/conv1/kernel``, ``blocks/11/attn/qkv/kernel``, ``head/bias``)."""
    parts = []
    for k in key_path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(p for p in parts if p != "value")


def _head(model: Any) -> str:
    for name in ("head", "fc", "classifier"):
        if hasattr(model, name):
            return name
    raise ValueError(
        f"trainable='head': {type(model).__name__} has no attribute head, fc or classifier; "
        "give regexes over parameter paths instead"
    )


LORA_TARGETS = r"attn/(qkv|proj)$|mlp/fc[12]$"  # ViT's attention and MLP kernels


def _parent(model: nnx.Module, path: Sequence[Any]) -> Any:
    node: Any = model
    for p in path[:-1]:
        node = node[p] if isinstance(p, int) else getattr(node, p)
    return node


def _set(parent: Any, key: Any, module: nnx.Module) -> None:
    if isinstance(key, int):
        parent[key] = module
    else:
        setattr(parent, key, module)


def add_lora(
    model: nnx.Module, rank: int = 8, targets: str = LORA_TARGETS, *, rngs: nnx.Rngs | None = None
) -> nnx.Module:
    """Adds LoRA adapters, in place, to the ``nnx.Linear`` layers whose path ``targets``
    matches: each becomes an ``nnx.LoRALinear`` with the same kernel and bias and a low-rank
    ``lora_a @ lora_b`` beside it (``lora_b`` starts at zero, so the outputs are unchanged).
    ``trainable(model, optimizer, "lora")`` then trains the adapters and the head only.

    Args:
        model: The NNX model, weights loaded.
        rank: The adapters' rank.
        targets: A regex searched in each Linear layer's path (default: a ViT's attention
            ``qkv`` and ``proj`` and its MLP's ``fc1`` and ``fc2``).
        rngs: Where ``lora_a`` is drawn from (``nnx.Rngs(0)`` when None).

    Returns:
        The model.
    """
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    found = [
        (path, m)
        for path, m in nnx.iter_graph(model)
        if type(m) is nnx.Linear and path and re.search(targets, "/".join(map(str, path)))
    ]
    if not found:
        raise ValueError(f"add_lora: no nnx.Linear layer's path matches {targets!r}")
    for path, linear in found:
        lora = nnx.LoRALinear(
            linear.in_features,
            linear.out_features,
            lora_rank=rank,
            use_bias=linear.bias is not None,
            dtype=linear.dtype,
            rngs=rngs,
        )
        lora.kernel[...] = linear.kernel[...]
        if linear.bias is not None:
            lora.bias[...] = linear.bias[...]  # type: ignore[index]
        _set(_parent(model, path), path[-1], lora)
    return model


def merge_lora(model: nnx.Module) -> nnx.Module:
    """Folds every LoRA adapter into its layer's kernel (``kernel + lora_a @ lora_b``), in
    place: the model becomes plain ``nnx.Linear`` layers again, for export and serving.

    Args:
        model: A model that ``add_lora`` changed.

    Returns:
        The model.
    """
    found = [(path, m) for path, m in nnx.iter_graph(model) if isinstance(m, nnx.LoRALinear) and path]
    for path, lora in found:
        linear = nnx.Linear(
            lora.in_features,
            lora.out_features,
            use_bias=lora.bias is not None,
            dtype=lora.dtype,
            rngs=nnx.Rngs(0),
        )
        linear.kernel[...] = lora.kernel[...] + lora.lora.lora_a[...] @ lora.lora.lora_b[...]
        if lora.bias is not None:
            linear.bias[...] = lora.bias[...]  # type: ignore[index]
        _set(_parent(model, path), path[-1], linear)
    return model


def _gate(step: int) -> optax.GradientTransformation:
    """Zero updates before optimizer step ``step``, then the updates as they are."""
    return optax.scale_by_schedule(lambda count: jnp.where(count >= step, 1.0, 0.0))


def trainable(
    model: nnx.Module,
    optimizer: optax.GradientTransformation,
    which: str | Sequence[str] = "all",
    *,
    groups: Mapping[str, optax.GradientTransformation] | None = None,
    unfreeze: Mapping[str, int] | None = None,
) -> optax.GradientTransformation:
    """An optimizer that trains only the parameters ``which`` names, for ``Trainer(model,
    optimizer=...)``.

    Frozen parameters go through ``optax.set_to_zero()``: no update and no optimizer state. A
    BatchNorm of ``ef.models`` whose parameters are all frozen is also kept in inference mode
    (its statistics stop moving), as Keras does for a layer with ``trainable = False``; this
    is set on ``model``, so call this before ``Trainer(model)``.

    Args:
        model: The NNX model (an ``ef.models`` one, or any NNX module).
        optimizer: The optax transformation for the trained parameters.
        which: ``"all"``, ``"head"`` (the model's ``head``, ``fc`` or ``classifier``),
            ``"lora"`` (the adapters ``add_lora`` added, and the head), ``"lora:rank=8"``
            (``add_lora(model, 8)`` first, then as ``"lora"``), or regexes searched in each
            parameter's path (``"layer4/"``, ``"^blocks/1[01]/"``).
        groups: Per-group optimizers, for other learning rates: ``{regex: transformation}``;
            a trained parameter takes the first group whose regex its path matches, else
            ``optimizer``.
        unfreeze: A schedule for the parameters ``which`` leaves frozen: ``{regex: step}``,
            the optimizer step from which the parameters the regex matches train (with
            ``optimizer``; ``steps_per_epoch * 2`` for the third epoch). Until then their
            updates are zero, but they keep optimizer state (it accumulates from the start)
            and their BatchNorm trains its statistics. The schedule is in the optimizer's
            state, so it resumes with a checkpoint.

    Returns:
        An ``optax.multi_transform``.

    Example:
        >>> import optax, easyfit as ef
        >>> model = ef.models.ResNet([1], bottleneck=False, num_classes=2, width=4)
        >>> tx = ef.models.trainable(model, optax.sgd(0.1), "head")
        >>> trainer = ef.Trainer(model, optimizer=tx)
    """
    if isinstance(which, str) and which.startswith("lora:"):  # "lora:rank=8"
        m = re.fullmatch(r"lora:rank=(\d+)", which)
        if not m:
            raise ValueError(f"trainable={which!r}: expected 'lora:rank=N'")
        add_lora(model, int(m.group(1)))
        which = "lora"
    if isinstance(which, str) and which not in ("all", "head", "lora"):
        raise ValueError(f"trainable={which!r}: expected 'all', 'head', 'lora', 'lora:rank=N' or regexes")
    if which == "lora":
        patterns = ["/lora/lora_[ab]$", f"^{_head(model)}/"]
    else:
        patterns = (
            [".*"]
            if which == "all"
            else [f"^{_head(model)}/"]
            if which == "head"
            else [str(w) for w in which]
        )
    compiled = [re.compile(p) for p in patterns]
    group_res = [(re.compile(r), f"group:{r}") for r in (groups or {})]
    params = nnx.state(model, nnx.Param)
    paths = [parameter_path(k) for k, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    named = ([] if which in ("all", "head", "lora") else patterns) + list(unfreeze or {})
    unused = [p for p in named if not any(re.search(p, x) for x in paths)]
    if unused:
        raise ValueError(f"trainable: {unused} match no parameter path (e.g. {paths[:3]})")

    later = [(re.compile(r), f"unfreeze:{r}", int(step)) for r, step in (unfreeze or {}).items()]

    def label(path: str) -> str:
        if not any(c.search(path) for c in compiled):
            return next((name for c, name, _ in later if c.search(path)), FROZEN)
        return next((name for c, name in group_res if c.search(path)), "default")

    def labels(tree: Any) -> Any:
        return jax.tree_util.tree_map_with_path(lambda k, _: label(parameter_path(k)), tree)

    frozen = {p for p in paths if label(p) == FROZEN}
    for path, module in nnx.iter_graph(model):
        if isinstance(module, nnx.BatchNorm):
            prefix = "/".join(str(p) for p in path)
            own = [p for p in paths if p.startswith(prefix + "/")]
            if own and hasattr(module, "frozen"):  # ef.models' BatchNorm
                module.frozen = all(p in frozen for p in own)
    transforms = {"default": optimizer, FROZEN: optax.set_to_zero()}
    transforms |= {name: groups[r.pattern] for r, name in group_res} if groups else {}
    transforms |= {name: optax.chain(optimizer, _gate(step)) for _, name, step in later}
    return optax.multi_transform(transforms, labels)
