"""Photos turned by their EXIF orientation (issue 27): DALI applies it as Pillow's
exif_transpose does, and a size that differs by it says so."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image, ImageOps

import easyfit as ef
from easyfit.data import Loader
from easyfit.data.images import sample_positions


def _jpeg(a: np.ndarray, orientation: int | None = None) -> bytes:
    exif = Image.Exif()
    if orientation:
        exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "JPEG", quality=95, exif=exif.tobytes())
    return buf.getvalue()


def _folder(root, n: int, turned: int, orientation: int = 6) -> str:
    rng = np.random.default_rng(0)
    for i in range(n):
        os.makedirs(root / str(i % 2), exist_ok=True)
        image = np.repeat(np.repeat(rng.integers(0, 255, (5, 5, 3), np.uint8), 4, 0), 6, 1)  # 20x30
        (root / str(i % 2) / f"{i:03d}.jpg").write_bytes(_jpeg(image, orientation if i == turned else None))
    return str(root / str(turned % 2) / f"{turned:03d}.jpg")


def _batch(source) -> np.ndarray:
    plan = ef.data.Plan(len(source), len(source), shuffle=False)
    loader = Loader(source, plan, ef.parallel.Placement.create())
    try:
        return np.asarray(next(loader)["x"])
    finally:
        loader.close()


@pytest.mark.parametrize("orientation", [6, 8])
def test_dali_applies_the_exif_orientation_as_exif_transpose_does(tmp_path, orientation):
    path = _folder(tmp_path, 1, 0, orientation)
    source = ef.data.ImageFolder(tmp_path)
    assert source.image_shape == (30, 20, 3)
    expected = np.asarray(ImageOps.exif_transpose(Image.open(path)))
    got = _batch(source)[0]
    assert np.abs(got.astype(int) - expected.astype(int)).mean() < 2  # two JPEG decoders


def test_a_sampled_photo_turned_by_its_exif_orientation_is_named_with_it(tmp_path):
    path = _folder(tmp_path, 10, 3)
    with pytest.raises(
        ef.errors.DataError,
        match=f"images differ in size .* {path} is 30x20 after its EXIF orientation 6 .a quarter turn, "
        "which DALI applies as Pillow's exif_transpose does",
    ):
        ef.data.ImageFolder(tmp_path)


def test_a_later_photo_turned_by_its_exif_orientation_is_said_to_be(tmp_path):
    n = 80
    sampled = set(sample_positions(n).tolist())  # positions in folder order: the even i first
    late = next(i for i in range(0, n, 2) if i // 2 not in sampled)
    path = _folder(tmp_path, n, late)
    source = ef.data.ImageFolder(tmp_path)
    with pytest.raises(
        ef.errors.DataError,
        match=r"differ in shape \(\(20, 30, 3\) and \(30, 20, 3\)\); height and width swapped: "
        f"{path} is decoded after its EXIF orientation 6 .a quarter turn",
    ):
        _batch(source)
