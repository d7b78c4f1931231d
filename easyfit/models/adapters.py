"""LoRA adapters on their own: saved without the base weights they were trained on, loaded
onto a model built from the same base, and folded in for inference.

An adapters folder holds, as PEFT's ``save_pretrained`` does, ``adapter_model.safetensors``
(the adapters ``lora_a`` and ``lora_b`` of every ``nnx.LoRALinear`` layer, and the head, which
trains with them; keys are parameter paths, ``blocks/0/attn/qkv/lora/lora_a``) and
``adapter_config.json``: the model's class, the rank, the adapted layers, and a SHA-256 of each
base parameter (every other parameter), so that loading onto another base is refused, naming
the parameters that differ. The weights' preprocessing and the training data's input recipe
ride along in the config. Written by ``Trainer.save(adapters_only=True)`` (and
``ModelCheckpoint(adapters_only=True)``), it also holds ``optimizer.safetensors``: the
optimizer state (the adapters' and head's moments), which ``Trainer.load`` restores with the
step, so that a fine-tune resumes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Any, cast

import jax
import numpy as np
from flax import nnx

from .._files import write_files
from ..core.models import ModelAdapter
from ..core.state import TrainState, inference_params
from .finetune import add_lora, merge_lora, parameter_path
from .weights import Preprocessing

__all__ = [
    "ADAPTERS",
    "CONFIG",
    "has_adapters",
    "is_adapters",
    "load_adapters",
    "merged_for_inference",
    "optimizer_arrays",
    "owned",
    "restore_optimizer",
    "save_adapters",
]

ADAPTERS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
OPTIMIZER = "optimizer.safetensors"
FORMAT = "easyfit-lora"
_ADAPTER = re.compile(r"/lora/lora_[ab]$")


def _flat(model: nnx.Module) -> dict[str, Any]:
    """Every parameter of ``model`` by its path (``a/b/kernel``): its NNX variable."""
    return {"/".join(map(str, key)): v for key, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _head_name(model: nnx.Module) -> str | None:
    return next((n for n in ("head", "fc", "classifier") if hasattr(model, n)), None)


def _lora_layers(model: nnx.Module) -> dict[str, int]:
    """The path of each ``nnx.LoRALinear`` layer, and its rank."""
    return {
        "/".join(map(str, path)): int(m.lora.lora_a.shape[-1])
        for path, m in nnx.iter_graph(model)
        if isinstance(m, nnx.LoRALinear) and path
    }


def has_adapters(params: Any) -> bool:
    """Whether a model's parameters (an ``nnx.State``, or any pytree keyed by path) hold LoRA
    adapters; reads their paths only, no array."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return any(_ADAPTER.search(parameter_path(key)) for key, _ in leaves)


def is_adapters(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder that ``save_adapters`` wrote (its config names the format)."""
    try:
        with open(os.path.join(os.fspath(path), CONFIG)) as f:
            return bool(json.load(f).get("format") == FORMAT)
    except (OSError, ValueError, AttributeError):
        return False


def owned(path: str | os.PathLike) -> bool:
    """Whether the folder ``path`` (not a link) holds what ``save_adapters`` wrote and nothing
    else, so that ``ModelCheckpoint(max_to_keep=)`` may delete it."""
    path = os.fspath(path)
    if os.path.islink(path) or not os.path.isdir(path) or not is_adapters(path):
        return False
    return set(os.listdir(path)) <= {ADAPTERS, CONFIG, OPTIMIZER}


def optimizer_arrays(opt_state: Any) -> dict[str, np.ndarray]:
    """The arrays of an optimizer state by their path in it (``jax.tree_util.keystr``): for a
    LoRA fine-tune, the adapters' and the head's moments alone (frozen parameters have none)."""
    leaves = jax.tree_util.tree_flatten_with_path(opt_state)[0]
    # np.array, not np.ascontiguousarray: a 0-d count stays 0-d
    return {jax.tree_util.keystr(k): np.array(jax.device_get(v), order="C") for k, v in leaves}


def restore_optimizer(target: Any, arrays: dict[str, np.ndarray]) -> tuple[Any, str | None]:
    """``(target with the saved arrays, None)`` when ``arrays`` (``optimizer_arrays``) has every
    array of the optimizer state ``target`` at its shape, each placed as the target's; else
    ``(target, why not)``."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    keys = [jax.tree_util.keystr(k) for k, _ in leaves]
    if set(keys) != set(arrays):
        differ = sorted(set(keys) ^ set(arrays))
        return target, f"another optimizer's ({len(differ)} arrays differ, e.g. {differ[0]})"
    for key, (_, leaf) in zip(keys, leaves, strict=True):
        if tuple(arrays[key].shape) != tuple(leaf.shape):
            return target, f"another optimizer's ({key}: {arrays[key].shape}, here {leaf.shape})"
    placed = [
        jax.device_put(arrays[key].astype(leaf.dtype), leaf.sharding)
        for key, (_, leaf) in zip(keys, leaves, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, placed), None


def _is_trained(path: str, head: str | None) -> bool:
    return bool(_ADAPTER.search(path)) or (head is not None and path.startswith(f"{head}/"))


def _base_hashes(flat: dict[str, Any], head: str | None) -> dict[str, str]:
    """SHA-256 of each base parameter (shape, dtype and bytes): the same with or without
    adapters, since a ``LoRALinear`` keeps its layer's kernel and bias at their paths."""
    out = {}
    for path, var in sorted(flat.items()):
        if _is_trained(path, head):
            continue
        a = np.ascontiguousarray(np.asarray(jax.device_get(var[...])))
        h = hashlib.sha256(f"{a.shape}{a.dtype}".encode())
        h.update(a.tobytes())
        out[path] = h.hexdigest()
    return out


def save_adapters(
    model: nnx.Module,
    path: str | os.PathLike,
    *,
    recipe: dict[str, Any] | None = None,
    class_names: list[str] | None = None,
    checkpoint: dict[str, Any] | None = None,
    optimizer: dict[str, np.ndarray] | None = None,
) -> str:
    """Writes ``model``'s LoRA adapters and its head, without the base weights, to the folder
    ``path`` (``adapter_model.safetensors`` and ``adapter_config.json``; other files there are
    left alone). ``Trainer.save(path, adapters_only=True)`` calls it with the trained weights.

    Args:
        model: An NNX model that ``add_lora`` (or ``trainable="lora:rank=N"``) changed.
        path: The folder to write.
        recipe: The training data's input recipe, kept in the config.
        class_names: The classes of the head, kept in the config.
        checkpoint: What ``Trainer.load`` restores besides the weights (JSON: the epoch and
            step reached, the seed, the input shape and scale), kept in the config.
        optimizer: The optimizer state's arrays (``optimizer_arrays``), written to
            ``optimizer.safetensors`` for a resumed fine-tune.

    Returns:
        The folder's absolute path.

    Raises:
        ValueError: ``model`` has no LoRA layer, or ``path`` is a file.
    """
    layers = _lora_layers(model) if isinstance(model, nnx.Module) else {}
    if not layers:
        raise ValueError(
            f"save_adapters: {type(model).__name__} has no LoRA layer: add them with "
            "ef.models.add_lora or trainable='lora:rank=N', or save the whole model"
        )
    folder = os.path.abspath(os.fspath(path))
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"save_adapters: {folder} is a file; give a folder")
    os.makedirs(folder, exist_ok=True)
    from safetensors.numpy import save

    head = _head_name(model)
    flat = _flat(model)
    arrays = {
        p: np.ascontiguousarray(np.asarray(jax.device_get(v[...])))
        for p, v in flat.items()
        if _is_trained(p, head)
    }
    pre = getattr(model, "preprocessing", None)
    config = {
        "format": FORMAT,
        "model": type(model).__name__,
        "rank": sorted(set(layers.values())),
        "layers": layers,
        "head": head,
        "class_names": None if class_names is None else list(class_names),
        "preprocessing": dataclasses.asdict(pre) if isinstance(pre, Preprocessing) else None,
        "recipe": recipe,
        "checkpoint": checkpoint,
        "optimizer": None if optimizer is None else OPTIMIZER,  # a file an older save left: unread
        "base_sha256": _base_hashes(flat, head),
    }
    files = {
        os.path.join(folder, ADAPTERS): save(arrays, metadata={"format": FORMAT}),
        os.path.join(folder, CONFIG): json.dumps(config, indent=1).encode(),
    }
    if optimizer is not None:
        files[os.path.join(folder, OPTIMIZER)] = save(optimizer, metadata={"format": FORMAT})
    write_files(files)
    return folder


def load_adapters(model: nnx.Module, path: str | os.PathLike) -> dict[str, Any]:
    """Loads adapters written by ``save_adapters`` (or ``Trainer.save(adapters_only=True)``)
    onto ``model``, in place, as PEFT's ``PeftModel.from_pretrained(base, path)`` does: the
    LoRA layers are added when the model has none, then the adapters and the head are set.

    ``model`` must be built from the same base weights as the model the adapters were
    trained on (``create_model(name, num_classes, weights=...)``, before or after
    ``add_lora``); nothing is changed otherwise. Its ``preprocessing`` becomes the one saved,
    when one was.

    Args:
        model: The NNX model, base weights loaded.
        path: The folder ``save_adapters`` wrote.

    Returns:
        The adapters' config: ``rank``, ``layers``, ``class_names``, ``recipe`` (the
        training data's input recipe, for ``ImageFolder`` or ``Trainer``), ...

    Raises:
        FileNotFoundError: ``path`` holds no adapters.
        ValueError: the model differs from the one the adapters were trained on (its class,
            its base weights, its LoRA layers or rank, its head's shape), naming what differs.
    """
    folder = os.path.abspath(os.fspath(path))
    file, cfg_file = os.path.join(folder, ADAPTERS), os.path.join(folder, CONFIG)
    if not (os.path.isfile(file) and os.path.isfile(cfg_file)):
        raise FileNotFoundError(f"load_adapters: {folder} holds no {ADAPTERS} and {CONFIG}")
    with open(cfg_file) as f:
        config = json.load(f)
    if config.get("format") != FORMAT:
        raise ValueError(f"load_adapters: {cfg_file} is not an easyfit adapters config (format {FORMAT!r})")
    where = f"adapters {folder}"
    if config["model"] != type(model).__name__:
        raise ValueError(f"{where} were trained on a {config['model']}, not a {type(model).__name__}")
    head = config["head"]
    flat = _flat(model)
    saved, mine = config["base_sha256"], _base_hashes(flat, head)
    if saved != mine:
        other = sorted(p for p in set(saved) & set(mine) if saved[p] != mine[p])
        listed = ", ".join(other[:5]) + (", ..." if len(other) > 5 else "")
        parts = [f"{len(other)} of {len(saved)} base parameters of other values ({listed})"] if other else []
        if set(saved) - set(mine):
            parts.append(f"missing in the model: {sorted(set(saved) - set(mine))[:5]}")
        if set(mine) - set(saved):
            parts.append(f"not in the adapters' base: {sorted(set(mine) - set(saved))[:5]}")
        raise ValueError(
            f"{where} were trained on other base weights than the model's: {'; '.join(parts)}; "
            "build the model from the base weights they were trained on"
        )
    layers = {p: int(r) for p, r in config["layers"].items()}
    have = _lora_layers(model)
    if not have:
        ranks = set(layers.values())
        for rank in sorted(ranks):
            chosen = [p for p, r in layers.items() if r == rank]
            add_lora(model, rank, "^(" + "|".join(re.escape(p) for p in chosen) + ")$")
        have = _lora_layers(model)
    if have != layers:
        differ = [
            f"{p}: rank {layers.get(p)} in the adapters, {have.get(p)} in the model"
            for p in sorted(set(layers) | set(have))
            if layers.get(p) != have.get(p)
        ]
        raise ValueError(f"{where} do not fit the model's LoRA layers: {'; '.join(differ[:5])}")
    from safetensors.numpy import load_file

    arrays = load_file(file)
    flat = _flat(model)
    wrong = [
        f"{p} {tuple(a.shape)} in the adapters, {tuple(flat[p][...].shape) if p in flat else 'absent'} "
        "in the model"
        for p, a in arrays.items()
        if p not in flat or tuple(flat[p][...].shape) != tuple(a.shape)
    ]
    if wrong:
        hint = (
            f" (build it with num_classes={len(config['class_names'])})" if config.get("class_names") else ""
        )
        raise ValueError(f"{where} do not fit the model{hint}: {'; '.join(wrong)}")
    for p, a in arrays.items():
        flat[p][...] = jax.numpy.asarray(a, dtype=flat[p][...].dtype)
    if config.get("preprocessing"):
        pre: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in config["preprocessing"].items()
        }
        model.preprocessing = Preprocessing(**pre)  # type: ignore[attr-defined]
    return config


def merged_for_inference(adapter: ModelAdapter, state: TrainState) -> tuple[ModelAdapter, TrainState]:
    """The model with its LoRA adapters folded into their kernels (``merge_lora``), for
    ``Trainer.export``: plain Linear layers, no adapter parameters, no extra matmuls. A model
    without LoRA layers (or a linen one) comes back as it was."""
    if adapter.kind != "nnx":
        return adapter, state
    model = nnx.merge(adapter.module, inference_params(state), state.model_state, copy=True)
    if not _lora_layers(model):
        return adapter, state
    merge_lora(model)
    graphdef, params, rest = cast(
        "tuple[nnx.GraphDef, nnx.State, nnx.State]", nnx.split(model, nnx.Param, ...)
    )
    return ModelAdapter("nnx", graphdef), state.replace(params=params, ema_params=None, model_state=rest)
