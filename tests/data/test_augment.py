"""Augmentation (training only, DALI side, reproducible by seed), user hooks, image formats."""

from __future__ import annotations

import numpy as np
import pytest

import easyfit as ef
from easyfit.data import Loader
from tests.helpers.formats import encode


def _batch(source, *, training, seed=0):
    plan = ef.data.Plan(source.num_samples, source.num_samples, shuffle=False, seed=seed)
    loader = Loader(source, plan, ef.parallel.Placement.create(), training=training)
    try:
        return np.asarray(next(loader)["x"])
    finally:
        loader.close()


@pytest.fixture(scope="module")
def images():
    """64 synthetic 12x10 images whose pixels are all different (no ties after a shift)."""
    rng = np.random.default_rng(0)
    base = rng.permutation(256)[:120].reshape(12, 10).astype(np.uint8)
    return np.stack([np.roll(base, i, axis=1) for i in range(64)])[..., None]


def _shifted(image, dy, dx):
    h, w = image.shape[:2]
    out = np.zeros_like(image)
    ys, xs = slice(max(0, -dy), min(h, h - dy)), slice(max(0, -dx), min(w, w - dx))
    out[ys, xs] = image[max(0, dy) : min(h, h + dy), max(0, dx) : min(w, w + dx)]
    return out


def test_augment_runs_on_training_batches_only_and_follows_the_seed(images):
    aug = ef.data.Augment(crop_padding=2, flip=True, rotation=10, brightness=0.2, contrast=0.2)
    source = ef.data.Arrays(images, np.zeros(len(images), np.int32), augment=aug)
    np.testing.assert_array_equal(_batch(source, training=False), images)
    augmented = _batch(source, training=True)
    assert augmented.shape == images.shape and augmented.dtype == np.uint8
    assert (augmented != images).any(axis=(1, 2, 3)).mean() > 0.9
    np.testing.assert_array_equal(_batch(source, training=True), augmented)  # same seed
    assert not np.array_equal(_batch(source, training=True, seed=1), augmented)


def test_random_crop_with_padding_is_a_shift_filled_with_zeros(images):
    aug = ef.data.Augment(crop_padding=3, flip=False)
    out = _batch(ef.data.Arrays(images, augment=aug), training=True)
    shifts = set()
    for original, got in zip(images, out, strict=True):
        match = [
            (dy, dx)
            for dy in range(-3, 4)
            for dx in range(-3, 4)
            if np.array_equal(_shifted(original, dy, dx), got)
        ]
        assert len(match) == 1
        shifts.add(match[0])
    assert len(shifts) > 10  # offsets vary from image to image


def test_flip_mirrors_about_half_of_the_images(images):
    out = _batch(ef.data.Arrays(images, augment=ef.data.Augment(flip=True)), training=True)
    flipped = [np.array_equal(g, o[:, ::-1]) for g, o in zip(out, images, strict=True)]
    kept = [np.array_equal(g, o) for g, o in zip(out, images, strict=True)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert 10 < sum(flipped) < 54


def test_rotation_and_brightness_contrast(images):
    rotated = _batch(ef.data.Arrays(images, augment=ef.data.Augment(flip=False, rotation=30)), training=True)
    assert rotated.shape == images.shape
    assert (rotated != images).any(axis=(1, 2, 3)).mean() > 0.9  # (a tiny angle changes nothing)
    lit = _batch(
        ef.data.Arrays(images, augment=ef.data.Augment(flip=False, brightness=0.3, contrast=0.3)),
        training=True,
    )
    assert (lit != images).any(axis=(1, 2, 3)).all()
    for original, got in zip(images, lit, strict=True):  # a positive affine map: order kept
        order = np.argsort(original.ravel())
        assert (np.diff(got.ravel()[order].astype(int)) >= 0).all()


def test_user_hooks_transform_every_split_and_augment_training(tmp_path, images):
    from nvidia.dali import fn

    for i, image in enumerate(images[:8]):
        (tmp_path / str(i % 2)).mkdir(exist_ok=True)
        (tmp_path / str(i % 2) / f"{i}.png").write_bytes(encode(image))
    folder = ef.data.ImageFolder(
        tmp_path,
        transform=lambda x: fn.flip(x, horizontal=0, vertical=1),
        augment=lambda x: fn.flip(x, horizontal=1),
    )
    order = [int(f.rsplit("/", 1)[1].split(".")[0]) for f in folder.files]
    np.testing.assert_array_equal(_batch(folder, training=False), images[order][:, ::-1])
    np.testing.assert_array_equal(_batch(folder, training=True), images[order][:, ::-1, ::-1])


@pytest.mark.parametrize("fmt", ["png", "jpeg", "bmp", "webp"])
def test_image_formats_color_modes_and_resizing(tmp_path, fmt):
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:24, 0:30]
    smooth = np.stack([yy * 9, xx * 7, (yy + xx) * 4], -1).astype(np.uint8)  # JPEG-friendly
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(3):
            h, w = rng.integers(10, 24), rng.integers(12, 30)
            (tmp_path / c / f"{i}.{fmt}").write_bytes(encode(smooth[:h, :w], fmt))
    resized = ef.data.ImageFolder(tmp_path, image_size=(16, 20))
    assert resized.color_mode == "rgb"
    assert _batch(resized, training=False).shape == (6, 16, 20, 3)
    (tmp_path / "same").mkdir()
    (tmp_path / "same" / "0").mkdir()
    (tmp_path / "same" / "0" / f"x.{fmt}").write_bytes(encode(smooth, fmt))
    exact = _batch(ef.data.ImageFolder(tmp_path / "same"), training=False)[0]
    if fmt == "jpeg":
        assert np.abs(exact.astype(int) - smooth).mean() < 3
    else:
        np.testing.assert_array_equal(exact, smooth)
    if fmt != "webp":  # WebP has no grayscale mode
        gray = smooth[..., 0]
        (tmp_path / "gray" / "0").mkdir(parents=True)
        (tmp_path / "gray" / "0" / f"g.{fmt}").write_bytes(encode(gray, fmt))
        folder = ef.data.ImageFolder(tmp_path / "gray")
        assert folder.color_mode == "grayscale" and folder.image_shape == (24, 30, 1)
        as_rgb = _batch(ef.data.ImageFolder(tmp_path / "gray", color_mode="rgb"), training=False)
        assert as_rgb.shape == (1, 24, 30, 3) and (as_rgb[..., 0] == as_rgb[..., 2]).all()
