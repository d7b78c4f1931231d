"""PyTorch checkpoints (timm, torchvision, Hugging Face) in safetensors files, loaded into
``ef.models``' modules: keys renamed by a small regex table per layout, kernels transposed to
Flax's layout, every shape checked.

The models carry timm's and torchvision's attribute names, so their keys map by turning dots
into path separators, ``weight`` into ``kernel`` (convolutions and dense layers) or ``scale``
(norms) and ``running_mean``/``running_var`` into BatchNorm's ``mean``/``var``; Hugging Face's
names are first renamed to timm's by the table below (its separate query, key and value
projections are joined into timm's ``qkv``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = ["LAYOUTS", "Preprocessing", "load_weights", "read_weights"]

_Rule = tuple[str, str | Callable[[re.Match[str]], str]]


def _plus1(group: int, template: str) -> Callable[[re.Match[str]], str]:
    """A replacement with group ``group`` counted from 1 instead of 0 (HF stages and layers)."""
    return lambda m: m.expand(template.replace("{n}", str(int(m.group(group)) + 1)))


_HF: list[_Rule] = [  # Hugging Face transformers' ResNet and ViT names -> timm's
    (r"^resnet\.embedder\.embedder\.convolution\.(\w+)$", r"conv1.\1"),
    (r"^resnet\.embedder\.embedder\.normalization\.(\w+)$", r"bn1.\1"),
    (
        r"^resnet\.encoder\.stages\.(\d+)\.layers\.(\d+)\.shortcut\.convolution\.(\w+)$",
        _plus1(1, r"layer{n}.\2.downsample.0.\3"),
    ),
    (
        r"^resnet\.encoder\.stages\.(\d+)\.layers\.(\d+)\.shortcut\.normalization\.(\w+)$",
        _plus1(1, r"layer{n}.\2.downsample.1.\3"),
    ),
    (
        r"^resnet\.encoder\.stages\.(\d+)\.layers\.(\d+)\.layer\.(\d+)\.convolution\.(\w+)$",
        lambda m: f"layer{int(m[1]) + 1}.{m[2]}.conv{int(m[3]) + 1}.{m[4]}",
    ),
    (
        r"^resnet\.encoder\.stages\.(\d+)\.layers\.(\d+)\.layer\.(\d+)\.normalization\.(\w+)$",
        lambda m: f"layer{int(m[1]) + 1}.{m[2]}.bn{int(m[3]) + 1}.{m[4]}",
    ),
    (r"^classifier\.1\.(\w+)$", r"fc.\1"),  # ResNetForImageClassification: Flatten, Linear
    (r"^vit\.embeddings\.cls_token$", "cls_token"),
    (r"^vit\.embeddings\.position_embeddings$", "pos_embed"),
    (r"^vit\.embeddings\.patch_embeddings\.projection\.(\w+)$", r"patch_embed.proj.\1"),
    (r"^vit\.encoder\.layer\.(\d+)\.layernorm_before\.(\w+)$", r"blocks.\1.norm1.\2"),
    (r"^vit\.encoder\.layer\.(\d+)\.layernorm_after\.(\w+)$", r"blocks.\1.norm2.\2"),
    (
        r"^vit\.encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(\w+)$",
        r"blocks.\1.attn.\2.\3",
    ),
    (r"^vit\.encoder\.layer\.(\d+)\.attention\.output\.dense\.(\w+)$", r"blocks.\1.attn.proj.\2"),
    (r"^vit\.encoder\.layer\.(\d+)\.intermediate\.dense\.(\w+)$", r"blocks.\1.mlp.fc1.\2"),
    (r"^vit\.encoder\.layer\.(\d+)\.output\.dense\.(\w+)$", r"blocks.\1.mlp.fc2.\2"),
    (r"^vit\.layernorm\.(\w+)$", r"norm.\1"),
    (r"^classifier\.(\w+)$", r"head.\1"),  # ViTForImageClassification
]
LAYOUTS: dict[str, list[_Rule]] = {
    "timm": [],  # timm's names are the models' own
    "torchvision": [],  # torchvision's ResNet names are timm's
    "hf": _HF,
}
_IGNORED = re.compile(r"(^|\.)num_batches_tracked$")  # PyTorch's BatchNorm counter: no use here
_LEAVES = {"running_mean": "mean", "running_var": "var", "bias": "bias"}


#: PIL's resampling filters by number (Hugging Face's ``resample``), and the name of
#: ``ImageFolder``'s ``interpolation`` for PIL's names where they differ.
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
_PIL_NAMES = {"lanczos": "lanczos3"}


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """How the weights' images were prepared (timm's pretrained config, a Hugging Face
    preprocessor config or the file's metadata), so that fine-tuning feeds the same.

    Attributes:
        input_size: ``(height, width)``.
        interpolation: The resize filter named by the weights ("bicubic", "bilinear"),
            which ``image_folder_kwargs`` passes on to ``ImageFolder`` (PIL's "lanczos" as
            "lanczos3"); a filter DALI's resize lacks ("box", "hamming") is refused there,
            naming it.
        crop_fraction: The center crop of evaluation (timm's ``crop_pct``).
        mean: Per channel, on the [0, 1] scale.
        std: Per channel, on the [0, 1] scale.
    """

    input_size: tuple[int, int] = (224, 224)
    interpolation: str = "bilinear"
    crop_fraction: float = 0.875
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)

    def image_folder_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """``ImageFolder``'s arguments for this recipe (``image_size``, ``normalize``,
        ``eval_crop``, ``interpolation``, and ``color_mode`` from the channels of ``mean``),
        with ``overrides`` replacing or adding any:
        ``ImageFolder(root, **pre.image_folder_kwargs(augment=...))``."""
        kwargs: dict[str, Any] = {
            "image_size": tuple(self.input_size),
            "normalize": (tuple(self.mean), tuple(self.std)),
            "eval_crop": self.crop_fraction,
            "color_mode": "grayscale" if len(self.mean) == 1 else "rgb",
            "interpolation": _PIL_NAMES.get(self.interpolation, self.interpolation),
        }
        return {**kwargs, **overrides}

    @classmethod
    def read(cls, path: str | os.PathLike) -> Preprocessing | None:
        """The preprocessing of the weights at ``path`` (a file or folder, as
        ``load_weights`` takes), from timm's config.json, Hugging Face's
        preprocessor_config.json or the file's metadata (``pretrained_cfg``, JSON); None when
        none says it. Reads no arrays, so the data can be opened before the model is built."""
        return _preprocessing(*_locate(path))

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Preprocessing | None:
        """From timm's ``pretrained_cfg`` (in its config.json), a Hugging Face preprocessor
        config, or safetensors metadata holding either as JSON; None when none is there."""
        cfg = dict(config.get("pretrained_cfg", config))
        if "input_size" in cfg:  # timm
            size = tuple(int(s) for s in cfg["input_size"][-2:])
            return cls(
                (size[0], size[1]),
                str(cfg.get("interpolation", "bicubic")),
                float(cfg.get("crop_pct", 0.875)),
                tuple(float(v) for v in cfg.get("mean", cls.mean)),
                tuple(float(v) for v in cfg.get("std", cls.std)),
            )
        if "image_mean" in cfg:  # Hugging Face's preprocessor_config.json
            hw: Any = cfg.get("crop_size") or cfg.get("size") or {}
            side: Any = hw.get("height", hw.get("shortest_edge", 224)) if isinstance(hw, dict) else hw
            crop = float(cfg.get("crop_pct") or 1.0)
            return cls(
                (int(side), int(hw.get("width", side) if isinstance(hw, dict) else side)),
                _RESAMPLE.get(cfg.get("resample", 2), str(cfg.get("resample"))),
                crop,
                tuple(float(v) for v in cfg["image_mean"]),
                tuple(float(v) for v in cfg["image_std"]),
            )
        return None


#: Weights named by a Hugging Face hub repository: ``hf://org/name`` or ``hf://org/name@revision``.
HUB = "hf://"
_HUB_FILES = ["model.safetensors", "config.json", "preprocessor_config.json"]


def _from_hub(spec: str) -> Path:
    """The local folder of the hub repository ``spec`` names, fetched by ``huggingface_hub``
    (only the weights and their configs; from its cache when they are there)."""
    repo, _, revision = spec[len(HUB) :].partition("@")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ImportError(
            f"weights {spec!r}: reading from the Hugging Face hub needs huggingface_hub "
            "(pip install 'easyfit-flax[hub]'), or download the files and pass their folder"
        ) from None
    try:
        return Path(snapshot_download(repo, revision=revision or None, allow_patterns=_HUB_FILES))
    except Exception as e:  # not found, offline without the files cached, no access
        raise FileNotFoundError(f"weights {spec!r}: the hub gave no weights for {repo!r}: {e}") from e


def _locate(path: str | os.PathLike) -> tuple[Path, list[Path]]:
    """The safetensors file, and the JSON configs beside it, of a file, a folder holding
    ``model.safetensors``, a Hugging Face hub cache folder (``models--org--name``), or a hub
    repository (``hf://org/name``)."""
    if isinstance(path, str) and path.startswith(HUB):
        path = _from_hub(path)
    p = Path(path)
    if p.is_file():
        return p, [
            c for c in (p.parent / "config.json", p.parent / "preprocessor_config.json") if c.is_file()
        ]
    if not p.is_dir():
        raise FileNotFoundError(f"weights: {p} is neither a .safetensors file nor a folder holding one")
    if (p / "model.safetensors").is_file():
        return _locate(p / "model.safetensors")
    found = sorted(p.glob("snapshots/*/model.safetensors"))  # a hub cache: one snapshot
    if len(found) == 1:
        return _locate(found[0])
    if len(found) > 1:
        raise ValueError(f"weights: {p} holds several snapshots ({[str(f.parent) for f in found]}); name one")
    raise FileNotFoundError(f"weights: {p} holds no model.safetensors (nor snapshots/*/model.safetensors)")


def _metadata(file: Path) -> dict[str, str]:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="np") as f:
            return dict(f.metadata() or {})
    except Exception as e:  # safetensors' errors name no file
        raise ValueError(f"weights: cannot read {file} as safetensors: {e}") from e


def _preprocessing(file: Path, configs: list[Path]) -> Preprocessing | None:
    for c in configs:
        pre = Preprocessing.from_config(json.loads(c.read_text()))
        if pre is not None:
            return pre
    metadata = _metadata(file)
    for key in ("pretrained_cfg", "preprocessing"):
        if key in metadata:
            return Preprocessing.from_config(json.loads(metadata[key]))
    return None


def model_config(path: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` beside the weights at ``path`` (empty when there is none)."""
    _, configs = _locate(path)
    found = [c for c in configs if c.name == "config.json"]
    return dict(json.loads(found[0].read_text())) if found else {}


def read_weights(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], Preprocessing | None]:
    """The arrays of a safetensors file (or a folder with ``model.safetensors``) and the
    preprocessing its configs or metadata give."""
    from safetensors.numpy import load_file

    file, configs = _locate(path)
    pre = _preprocessing(file, configs)
    try:
        arrays = load_file(str(file))
    except Exception as e:  # safetensors' errors name no file
        raise ValueError(f"weights: cannot read {file} as safetensors: {e}") from e
    return arrays, pre


def _rename(key: str, rules: list[_Rule]) -> str | None:
    for pattern, repl in rules:
        new, n = re.subn(pattern, repl, key)  # type: ignore[call-overload]
        if n:
            return str(new)
    return None


def _to_timm(arrays: Mapping[str, np.ndarray], layout: str) -> dict[str, tuple[str, np.ndarray]]:
    """timm name -> (the file's name, array); for "hf", query, key and value joined as qkv."""
    rules = LAYOUTS[layout]
    out: dict[str, tuple[str, np.ndarray]] = {}
    for key, value in arrays.items():
        if _IGNORED.search(key):
            continue
        name = _rename(key, rules) if rules else key
        out[name if name is not None else f"<unmapped>{key}"] = (key, value)
    for qname in [n for n in out if re.search(r"\.attn\.query\.\w+$", n)]:
        parts = [qname.replace(".query.", f".{w}.") for w in ("query", "key", "value")]
        if all(p in out for p in parts):
            joined = np.concatenate([out.pop(p)[1] for p in parts], axis=0)
            out[qname.replace(".query.", ".qkv.")] = (qname.replace(".query.", ".{query,key,value}."), joined)
    return out


def _flax_name(name: str, model_paths: set[str]) -> tuple[str, Callable[[np.ndarray], np.ndarray]]:
    """The model path a timm name goes to, and how its array is laid out for Flax."""
    prefix, _, leaf = name.rpartition(".")
    base = prefix.replace(".", "/")
    if leaf == "weight":
        if f"{base}/kernel" in model_paths:
            return f"{base}/kernel", _kernel
        return f"{base}/scale", lambda a: a
    path = f"{base}/{_LEAVES.get(leaf, leaf)}" if prefix else name
    return path, lambda a: a


def _kernel(a: np.ndarray) -> np.ndarray:
    if a.ndim == 4:  # convolution: PyTorch's OIHW -> Flax's HWIO
        return a.transpose(2, 3, 1, 0)
    if a.ndim == 2:  # dense: (out, in) -> (in, out)
        return a.T
    return a


def _timm_key(path: str) -> str:
    """The timm (and torchvision) name a model path is read from: for a missing key's message."""
    prefix, _, leaf = path.rpartition("/")
    leaf = {"kernel": "weight", "scale": "weight", "mean": "running_mean", "var": "running_var"}.get(
        leaf, leaf
    )
    return f"{prefix.replace('/', '.')}.{leaf}" if prefix else leaf


def _head(model: Any) -> str | None:
    return "fc" if hasattr(model, "fc") else "head" if hasattr(model, "head") else None


def load_weights(
    model: nnx.Module, path: str | os.PathLike, layout: str = "timm", *, strict_head: bool = False
) -> nnx.Module:
    """Loads a PyTorch checkpoint in safetensors form into ``model``, in place, and returns it.

    Keys are renamed by the layout's table, convolution kernels transposed from OIHW to HWIO
    and dense kernels from ``(out, in)`` to ``(in, out)``; BatchNorm's running statistics
    become the model's ``mean`` and ``var``. Every key of the file must find a variable of the
    same shape, and every variable of the model a key, except the head when its number of
    classes differs from the file's (fine-tuning: the model keeps its fresh head). Otherwise
    nothing is changed and one ValueError lists every missing, extra or mis-shaped key with
    its name in the file and in the model. A ``layer_norm_eps`` in config.json (Hugging
    Face's ViT: 1e-12) must equal the model's ``norm_eps``. The weights' preprocessing, when the file or its
    folder says it, is set as ``model.preprocessing`` (a ``Preprocessing``).

    Args:
        model: An ``ef.models`` module (``ResNet``, ``ViT``), or any NNX module laid out with
            timm's names.
        path: A ``.safetensors`` file, or a folder (a download, a hub cache
            ``models--org--name``) holding ``model.safetensors`` and maybe ``config.json``,
            or ``"hf://org/name"`` (``@revision`` optional): that hub repository's files,
            fetched by ``huggingface_hub`` (the ``hub`` extra) or read from its cache.
        layout: Whose names the file uses: ``"timm"``, ``"torchvision"`` or ``"hf"`` (Hugging
            Face transformers).
        strict_head: Refuse a head of another shape too, instead of keeping the model's.

    Returns:
        The model, holding the weights.

    Example:
        >>> import numpy as np, tempfile, easyfit as ef
        >>> from safetensors.numpy import save_file
        >>> file = tempfile.mkdtemp() + "/w.safetensors"
        >>> save_file({"fc.weight": np.zeros((5, 3), np.float32)}, file)
        >>> model = ef.models.ResNet([1], bottleneck=False, num_classes=5, width=4)
        >>> ef.models.load_weights(model, file)
        Traceback (most recent call last):
        ...
        ValueError: weights ... do not fit ResNet: 16 missing (in the model, not in the file; ...
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: expected one of {sorted(LAYOUTS)}")
    eps = model_config(path).get("layer_norm_eps")  # Hugging Face's ViT: 1e-12, timm's 1e-6
    norm = getattr(model, "norm", None)
    if eps is not None and isinstance(norm, nnx.LayerNorm) and not np.isclose(norm.epsilon, eps, rtol=1e-3):
        raise ValueError(
            f"weights {path}: config.json's layer_norm_eps is {eps}, the model's {norm.epsilon}: "
            f"build the model with norm_eps={eps} (create_model does so from the config)"
        )
    arrays, pre = read_weights(path)
    state = nnx.state(model, nnx.Any(nnx.Param, nnx.BatchStat))
    variables = {"/".join(str(k) for k in key): v for key, v in nnx.to_flat_state(state)}
    paths = set(variables)
    head = _head(model)
    planned: dict[str, np.ndarray] = {}
    extra, misshaped, kept_head = [], [], []
    for name, (key, value) in _to_timm(arrays, layout).items():
        target, arrange = _flax_name(name, paths) if not name.startswith("<unmapped>") else (name, None)
        if target not in variables or arrange is None:
            extra.append(f"{key} (no model path; looked for {target})")
            continue
        value = arrange(value)
        want = tuple(variables[target][...].shape)
        if tuple(value.shape) != want:
            if head and target.startswith(f"{head}/") and not strict_head:
                kept_head.append(target)
                continue
            kept_head.append(target)  # named below, not missing
            misshaped.append(f"{key} {tuple(arrays[key].shape) if key in arrays else ''} -> {target} {want}")
            continue
        planned[target] = value
    missing = [f"{p} (as {_timm_key(p)})" for p in sorted(paths - set(planned) - set(kept_head))]
    if missing or extra or misshaped:
        parts = []
        if missing:
            parts.append(
                f"{len(missing)} missing (in the model, not in the file; timm's name after 'as'): "
                + ", ".join(missing)
            )
        if extra:
            parts.append(f"{len(extra)} extra (in the file, not in the model): {', '.join(extra)}")
        if misshaped:
            parts.append(f"{len(misshaped)} of other shapes (file -> model): {', '.join(misshaped)}")
        raise ValueError(
            f"weights {path} (layout {layout!r}) do not fit {type(model).__name__}: " + "; ".join(parts)
        )
    for target, value in planned.items():
        var = variables[target]
        var[...] = jnp.asarray(value, dtype=var[...].dtype)
    if pre is not None:
        model.preprocessing = pre  # type: ignore[attr-defined]
    return model
