"""Reference weights and inputs drawn from NumPy alone, so that the tests draw the same arrays
make_reference.py gave PyTorch without torch. Only ``Generator.random`` (float64 uniforms) is
used: its stream is the most stable NumPy keeps across versions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MODELS = {  # file stem: (weights seed, input shape NCHW)
    "torchvision_resnet18": (18, (2, 3, 224, 224)),
    "torchvision_resnet50": (50, (1, 3, 224, 224)),
    "timm_vit_small_patch16_224": (16, (1, 3, 224, 224)),
}
INPUT_SEED = 1
Entries = list[tuple[str, tuple[int, ...], str]]  # key, shape, dtype


def keys(name: str) -> Entries:
    """The state_dict's keys, shapes and dtypes, in order, from ``<name>.keys.json``."""
    entries = json.loads((HERE / f"{name}.keys.json").read_text())
    return [(k, tuple(s), d) for k, s, d in entries]


def weights(name: str, entries: Entries | None = None) -> dict[str, np.ndarray]:
    """Every array of the state_dict, drawn in key order from the model's seed: kernels
    uniform with He's variance, norms' scales near 1, biases and statistics small."""
    rng = np.random.default_rng(MODELS[name][0] if name in MODELS else 0)
    out: dict[str, np.ndarray] = {}
    for key, shape, dtype in entries if entries is not None else keys(name):
        u = rng.random(shape)  # float64 in [0, 1)
        if dtype == "int64":
            out[key] = np.zeros(shape, np.int64)
            continue
        if key.endswith("running_var"):
            a = 0.5 + u
        elif key.endswith("running_mean"):
            a = (u - 0.5) * 0.2
        elif len(shape) == 1 and key.endswith("weight"):
            a = 0.75 + 0.5 * u
        elif len(shape) == 1:
            a = (u - 0.5) * 0.2
        elif key in ("cls_token", "pos_embed"):
            a = (u - 0.5) * 0.04
        else:
            bound = math.sqrt(6.0 / math.prod(shape[1:]))
            a = (2 * u - 1) * bound
        out[key] = a.astype(np.float32)
    return out


def images(name: str) -> np.ndarray:
    """The fixed input, NCHW float32, values like normalised photos."""
    return ((np.random.default_rng(INPUT_SEED).random(MODELS[name][1]) - 0.5) * 4.0).astype(np.float32)
