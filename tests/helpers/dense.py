"""Small data sets with dense targets, written as files, and a model for them: segmentation
folders (images and class-id masks) and CSV files of regression targets."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from flax import linen as nn

from easyfit._synthetic import write_png

#: The colour of each class in the images of :func:`write_segmentation` (noise added).
PALETTE = np.array([[30, 30, 30], [200, 60, 60], [60, 60, 200]], np.uint8)


def write_segmentation(
    root: str | os.PathLike, n: int, size: tuple[int, int] = (16, 16), seed: int = 0
) -> list[np.ndarray]:
    """``root/images/NNN.png`` (RGB) and ``root/masks/NNN.png`` (class ids 0..2 in 4x4
    blocks); each pixel's colour says its class (``PALETTE``, plus noise). Returns the masks."""
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    masks = []
    for i in range(n):
        blocks = rng.integers(0, len(PALETTE), (-(-size[0] // 4), -(-size[1] // 4)))
        ids = np.kron(blocks, np.ones((4, 4), np.int64))[: size[0], : size[1]].astype(np.uint8)
        noise = rng.integers(-20, 21, (*size, 3))
        write_png(root / "images" / f"{i:03d}.png", np.clip(PALETTE[ids] + noise, 0, 255))
        write_png(root / "masks" / f"{i:03d}.png", ids)
        masks.append(ids)
    return masks


def write_image_csv(
    folder: str | os.PathLike,
    n: int,
    size: tuple[int, int] = (8, 8),
    seed: int = 0,
    name: str = "targets.csv",
) -> tuple[str, np.ndarray]:
    """``n`` grayscale PNGs of one brightness each and a CSV of two targets per image: the
    brightness in [0, 1] and one minus it. Returns the CSV's path and the targets."""
    folder = Path(folder)
    (folder / "img").mkdir(parents=True, exist_ok=True)
    values = np.random.default_rng(seed).integers(0, 256, n)
    lines = ["file,bright,dark"]
    targets = np.stack([values / 255.0, 1 - values / 255.0], axis=1).astype(np.float32)
    for i, (v, t) in enumerate(zip(values, targets, strict=True)):
        write_png(folder / "img" / f"{i:03d}.png", np.full(size, v, np.uint8))
        lines.append(f"img/{i:03d}.png,{float(t[0])!r},{float(t[1])!r}")
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return str(path), targets


class TinySegmenter(nn.Module):
    """Per-pixel logits ``(H, W, classes)``: a 3x3 convolution, then a 1x1 one."""

    classes: int = 3

    @nn.compact
    def __call__(self, x):
        return nn.Conv(self.classes, (1, 1))(nn.relu(nn.Conv(8, (3, 3))(x)))


class Regressor(nn.Module):
    """A linear layer over the image's mean brightness: ``outputs`` values per sample."""

    outputs: int = 2

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.outputs)(x.mean(axis=(1, 2)))
