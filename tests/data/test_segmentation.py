"""Segmentation folders: images and class-id masks decoded by DALI with one geometry (issue 15)."""

from __future__ import annotations

import glob
import os

import numpy as np
import optax
import pytest
from PIL import Image

import easyfit as ef
from easyfit._synthetic import write_png
from easyfit.data.loader import Loader, decide_cache
from easyfit.parallel import Placement
from tests.helpers import flat_params
from tests.helpers.dense import PALETTE, TinySegmenter, write_segmentation
from tests.helpers.formats import encode


def _batch(source, *, training, seed=0):
    plan = ef.data.Plan(source.num_samples, source.num_samples, shuffle=False, seed=seed)
    loader = Loader(source, plan, Placement.create(), training=training)
    try:
        batch = next(loader)
        return np.asarray(batch["x"]), np.asarray(batch["y"])
    finally:
        loader.close()


def _folder(root, images, masks):
    for d in ("images", "masks"):
        os.makedirs(root / d, exist_ok=True)
    for i, (image, mask) in enumerate(zip(images, masks, strict=True)):
        write_png(root / "images" / f"{i:02d}.png", image)
        write_png(root / "masks" / f"{i:02d}.png", mask)
    return str(root)


@pytest.fixture(scope="module")
def coded(tmp_path_factory):
    """12 images whose red channel is 40 x the class id of the mask's pixel (random ids 0..5)."""
    rng = np.random.default_rng(0)
    masks = rng.integers(0, 6, (12, 12, 10)).astype(np.uint8)
    images = np.stack([masks * 40, 255 - masks * 40, np.full_like(masks, 7)], axis=-1)
    return _folder(tmp_path_factory.mktemp("coded"), images, masks), masks


@pytest.mark.parametrize("normalize", [None, (0.0, 1.0)], ids=["uint8", "normalized"])
def test_masks_follow_the_flip_and_padded_crop_of_their_images_exactly(coded, normalize):
    root, masks = coded
    augment = ef.data.Augment(crop_padding=3, flip=True)
    source = ef.data.SegmentationFolder(root, augment=augment, normalize=normalize)
    x, y = _batch(source, training=True)
    assert y.shape == (12, 12, 10) and y.dtype == np.int32
    red = np.rint(x[..., 0].astype(np.float32) * (255 if normalize else 1)).astype(np.int32)
    np.testing.assert_array_equal(y, red // 40)  # every pixel: the mask moved with its image
    assert (y != masks).any(axis=(1, 2)).mean() > 0.8  # and they did move
    np.testing.assert_array_equal(_batch(source, training=False)[1], masks)  # evaluation: as is


@pytest.mark.parametrize("normalize", [None, (0.0, 1.0)], ids=["uint8", "normalized"])
def test_masks_follow_random_resized_crops_and_rotations(tmp_path, normalize):
    """Images hold their own coordinates (red: x, green: y, blue: 255 inside the picture), masks
    a class per 16x16 block. After the same crop, resize, flip and rotation, the class of every
    pixel must be that of the block the image's pixel came from. Tolerance: pixels within 2
    source pixels of a block edge, or blended with a rotation's fill (blue < 250), are skipped,
    since the image is resized bilinearly and the mask by nearest neighbour."""
    h, w = 48, 64
    yy, xx = np.mgrid[0:h, 0:w]
    image = np.stack(
        [np.rint(xx * 255 / (w - 1)), np.rint(yy * 255 / (h - 1)), np.full((h, w), 255)], axis=-1
    ).astype(np.uint8)
    mask = ((xx // 16) + 4 * (yy // 16)).astype(np.uint8)  # 12 classes, asymmetric left-right
    root = _folder(tmp_path, [image] * 16, [mask] * 16)
    augment = ef.data.Augment(random_resized_crop=(0.3, 1.0), flip=True, rotation=15)
    source = ef.data.SegmentationFolder(root, image_size=(32, 32), augment=augment, normalize=normalize)
    assert source.eval_crop == 0.875  # evaluation: resize and center crop (fused when normalized)
    for training in (True, False):
        x, y = _batch(source, training=training)
        x = np.rint(x.astype(np.float32) * (255 if normalize else 1))
        assert x.shape == (16, 32, 32, 3) and y.shape == (16, 32, 32)
        sx = x[..., 0].astype(np.float64) * (w - 1) / 255
        sy = x[..., 1].astype(np.float64) * (h - 1) / 255
        expected = (np.floor(sx / 16) + 4 * np.floor(sy / 16)).astype(np.int32)
        near_edge = (np.abs(sx - 16 * np.rint(sx / 16)) < 2) | (np.abs(sy - 16 * np.rint(sy / 16)) < 2)
        kept = (x[..., 2] >= 250) & ~near_edge
        assert kept.mean() > 0.4
        np.testing.assert_array_equal(y[kept], expected[kept])
        assert set(np.unique(y)) <= set(range(12))  # nearest neighbour: no blended ids


@pytest.fixture(scope="module")
def seg_root(tmp_path_factory):
    """root/train (24) and root/val (10) segmentation folders of 16x16 images, 3 classes."""
    root = tmp_path_factory.mktemp("seg")
    write_segmentation(root / "train", 24, seed=0)
    write_segmentation(root / "val", 10, seed=1)
    return str(root)


def _ce(logits, masks):
    """Per-image mean over pixels of the softmax cross-entropy, in float64 (the hand version)."""
    z = logits.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, masks[..., None].astype(np.int64), -1)[..., 0]
    return -picked.reshape(len(masks), -1).mean(1)


def test_fit_evaluate_predict_on_a_segmentation_folder(seg_root):
    assert ef.data.detect(seg_root + "/train") is ef.data.SegmentationFolder
    trainer = ef.Trainer(TinySegmenter(), optimizer=optax.adam(0.05), seed=0)
    history = trainer.fit(seg_root, epochs=4, batch_size=8, verbose=0)  # train/ and val/ found
    assert trainer.loss == "sparse_categorical_crossentropy"
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0], losses
    assert history.history["val_accuracy"][-1] > 0.9
    val = ef.data.SegmentationFolder(seg_root + "/val")
    logits = trainer.predict(val, batch_size=4)  # 10 images in batches of 4: 2 padding rows
    assert logits.shape == (10, 16, 16, 3)
    masks = np.stack([np.asarray(Image.open(p)) for p in sorted(glob.glob(seg_root + "/val/masks/*"))])
    logs = trainer.evaluate(val, batch_size=4)
    np.testing.assert_allclose(logs["loss"], _ce(logits, masks).mean(), rtol=1e-5)
    np.testing.assert_allclose(logs["accuracy"], (logits.argmax(-1) == masks).mean(), rtol=1e-6)


def test_the_device_cache_replays_a_segmentation_folder_bit_for_bit(seg_root):
    def fit(cache):
        trainer = ef.Trainer(TinySegmenter(), optimizer=optax.adam(0.05), seed=0)
        history = trainer.fit(seg_root + "/train", epochs=2, batch_size=8, verbose=0, cache=cache)
        history.history.pop("input_wait")
        return trainer, history.history

    placement = Placement.create()
    source = ef.data.SegmentationFolder(seg_root + "/train")
    assert decide_cache("auto", source, placement)[0]
    assert source.sample_nbytes == 16 * 16 * 3 + 16 * 16 * 4
    (streamed, h1), (cached, h2) = fit(False), fit("auto")
    np.testing.assert_array_equal(flat_params(streamed.params), flat_params(cached.params))
    assert h1 == h2


def test_a_resumed_fit_with_random_crops_and_flips_ends_bit_exact(seg_root, tmp_path):
    from easyfit.callbacks import BackupAndRestore, LambdaCallback

    augment = ef.data.Augment(random_resized_crop=(0.5, 1.0), flip=True)

    def fit(callbacks=()):
        trainer = ef.Trainer(TinySegmenter(), optimizer=optax.adam(0.05), seed=3)
        train = ef.data.SegmentationFolder(seg_root + "/train", image_size=(12, 12), augment=augment)
        trainer.fit(train, epochs=2, batch_size=8, verbose=0, callbacks=list(callbacks))
        return trainer

    class Crash(RuntimeError):
        pass

    def crash(batch, logs):  # in the second epoch, after a backup at its first batch
        if len(seen) == 5 and not crashed:
            crashed.append(batch)
            raise Crash

    crashed: list[int] = []
    seen: list[int] = []
    reference = fit()
    with pytest.raises(Crash):
        fit(
            [
                BackupAndRestore(tmp_path / "b", save_freq=2),
                LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(batch)),
                LambdaCallback(on_train_batch_end=crash),
            ]
        )
    point = BackupAndRestore(tmp_path / "b").restore_point()
    assert (point.epoch, point.batch) == (1, 1)
    resumed = fit([BackupAndRestore(tmp_path / "b", save_freq=2)])
    np.testing.assert_array_equal(flat_params(resumed.params), flat_params(reference.params))


# ------------------------------------------------------------------------------------ errors
def test_an_image_without_a_mask_and_a_mask_without_an_image_are_named(tmp_path):
    root = tmp_path / "seg"
    write_segmentation(root, 3)
    os.remove(root / "masks" / "001.png")
    with pytest.raises(ef.errors.DataError, match=rf"^{root}/images/001.png: no mask of that name \("):
        ef.data.SegmentationFolder(root)
    write_png(root / "masks" / "001.png", np.zeros((16, 16), np.uint8))
    write_png(root / "masks" / "007.png", np.zeros((16, 16), np.uint8))
    with pytest.raises(ef.errors.DataError, match=rf"^{root}/masks/007.png: no image of that name"):
        ef.data.SegmentationFolder(root)
    os.remove(root / "masks" / "007.png")
    (root / "images" / "002.jpg").write_bytes(encode(np.zeros((16, 16, 3)), "jpeg"))
    with pytest.raises(
        ef.errors.DataError, match=rf"^{root}/images/002.png: the same name as {root}/images/002.jpg"
    ):
        ef.data.SegmentationFolder(root)
    with pytest.raises(ef.errors.DataError, match=rf"^{tmp_path}/none: no such directory"):
        ef.data.SegmentationFolder(tmp_path / "none")


@pytest.mark.parametrize(
    "mask, message",
    [
        (
            lambda: encode(np.zeros((16, 16, 3)), "png"),
            "its mask .*: 8-bit RGB PNG; a mask must be an 8-bit grayscale PNG",
        ),
        (lambda: _palette(), r"its mask .*: \d-bit palette PNG; a mask must be"),
        (lambda: encode(np.zeros((16, 12)), "png"), "16x16 image, but its mask .* is 16x12"),
        (lambda: b"\x89PNG\r\n\x1a\nbroken", "its mask .*: truncated PNG"),
    ],
    ids=["rgb", "palette", "size", "truncated"],
)
def test_a_mask_that_cannot_be_class_ids_of_its_image_is_named(tmp_path, trainer_seg, mask, message):
    root = tmp_path / "seg"
    write_segmentation(root, 4)
    (root / "masks" / "002.png").write_bytes(mask())
    with pytest.raises(ef.errors.DataError, match=rf"^{root}/images/002.png: {message}"):
        trainer_seg.fit(ef.data.SegmentationFolder(root), epochs=1, batch_size=4, verbose=0)


def _palette() -> bytes:
    import io

    image = Image.new("P", (16, 16))
    image.putpalette(PALETTE.ravel().tolist())
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def trainer_seg():
    return ef.Trainer(TinySegmenter(), optimizer=optax.adam(0.05), seed=0)


def test_class_ids_outside_the_models_outputs_are_named(tmp_path, trainer_seg):
    root = tmp_path / "seg"
    write_segmentation(root, 4)
    write_png(root / "masks" / "003.png", np.full((16, 16), 255, np.uint8))
    with pytest.raises(
        ef.errors.DataError, match=r"class id 255 \(in the first batch\) is outside the model's 3"
    ):
        trainer_seg.fit(str(root), epochs=1, batch_size=4, verbose=0)


def test_what_cannot_apply_to_masks_is_refused(seg_root):
    with pytest.raises(ValueError, match="takes an easyfit.data.Augment"):
        ef.data.SegmentationFolder(seg_root + "/train", augment=lambda images: images)
    trainer = ef.Trainer(TinySegmenter(), optimizer=optax.adam(0.05), seed=0)
    with pytest.raises(ValueError, match=r"class_weight: labels of shape \(16, 16\) per sample"):
        trainer.fit(seg_root + "/train", epochs=1, batch_size=8, verbose=0, class_weight={0: 1.0, 1: 2.0})
