"""The ImageNet recipe on the DALI side: random resized crops cut from the decoded images,
validation's resize and center crop, normalisation in DALI, augmentation randomness per sample
(so per pipeline and device) that resumes exactly. Real JPEGs of varied sizes, written here."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import linen as nn

import easyfit as ef
from easyfit.callbacks import BackupAndRestore, LambdaCallback
from easyfit.data import Loader
from easyfit.parallel import Placement
from tests.helpers.internals import built_pipelines

SIZE = (24, 24)
MEAN, STD = np.array(ef.data.images.IMAGENET[0]), np.array(ef.data.images.IMAGENET[1])


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> str:
    """4 classes of JPEG photos, 40 to 90 pixels a side: 12 training and 4 validation each."""
    root = tmp_path_factory.mktemp("photos") / "photos"
    return ef.datasets.synthetic_images(
        root, classes=4, per_class=(12, 4), size=(40, 90), image_format="jpeg", workers=1
    )


def _chunks(source, *, training, seed=0, epochs=1, pipelines=None, shuffle=False):
    """Each epoch's training (or evaluation) batch of all samples, as NumPy."""
    n = source.num_samples
    plan = ef.data.Plan(n, n, shuffle=shuffle, seed=seed)
    loader = Loader(source, plan, Placement.create(), training=training, pipelines_per_device=pipelines)
    try:
        return [np.asarray(next(loader)["x"]) for _ in range(epochs)]
    finally:
        loader.close()


def _train(photos, **kwargs):
    aug = ef.data.Augment(random_resized_crop=(0.08, 1.0), flip=True)
    return ef.data.ImageFolder(photos + "/train", image_size=SIZE, augment=aug, **kwargs)


def test_random_crops_vary_by_epoch_and_repeat_by_seed(photos):
    source = _train(photos)
    first, second = _chunks(source, training=True, epochs=2)
    assert first.shape == (48, *SIZE, 3) and first.dtype == np.uint8
    assert (first != second).any(axis=(1, 2, 3)).all()  # every image cropped anew each epoch
    again = _chunks(source, training=True, epochs=2)
    np.testing.assert_array_equal(again[0], first)  # same seed, same crops
    np.testing.assert_array_equal(again[1], second)
    other = _chunks(source, training=True, seed=1)[0]
    assert (other != first).any(axis=(1, 2, 3)).mean() > 0.9


def test_each_pipeline_draws_its_own_crops(tmp_path):
    """48 copies of one photo read by 2 pipelines: with one random stream per pipeline seeded
    alike, row k of each pipeline got the same crop; each sample draws its own."""
    one = ef.datasets.synthetic_images(
        tmp_path / "one", classes=1, per_class=(1, 0), size=(60, 80), image_format="jpeg"
    )
    data = open(one + "/train/class_000/00000.jpg", "rb").read()
    for i in range(48):
        (tmp_path / "same" / "a").mkdir(parents=True, exist_ok=True)
        (tmp_path / "same" / "a" / f"{i:03d}.jpg").write_bytes(data)
    aug = ef.data.Augment(random_resized_crop=(0.08, 1.0), flip=True)
    source = ef.data.ImageFolder(tmp_path / "same", image_size=SIZE, augment=aug)
    two = _chunks(source, training=True, pipelines=2)[0]
    assert (two[:24] != two[24:]).any(axis=(1, 2, 3)).all()
    assert len({row.tobytes() for row in two}) == 48
    # and the layout of pipelines does not change what a sample gets
    np.testing.assert_array_equal(_chunks(source, training=True, pipelines=1)[0], two)


def test_a_random_resized_crop_is_cut_from_the_decoded_image_without_peeking_at_its_shape(tmp_path):
    """The window's size comes from the decoded image's shape: no ``fn.peek_image_shape`` in
    the training pipeline (it opens an image codec of its own: about a second of each first
    pipeline build on a GPU). A crop of the whole area at a square image's own aspect ratio is
    the whole image, resized as a plain resize does, pixel for pixel."""
    root = ef.datasets.synthetic_images(
        tmp_path / "square", classes=2, per_class=(6, 0), size=(48, 48), image_format="jpeg", workers=1
    )
    whole = ef.data.Augment(random_resized_crop=(1.0, 1.0), aspect_ratio=(1.0, 1.0), flip=False)
    source = ef.data.ImageFolder(root + "/train", image_size=SIZE, augment=whole)
    plan = ef.data.Plan(source.num_samples, source.num_samples, shuffle=False)
    loader = Loader(source, plan, Placement.create(), training=True)
    try:
        cropped = np.asarray(next(loader)["x"])
        graph = built_pipelines(loader)[0].serialize()  # built by the first chunk
    finally:
        loader.close()
    assert b"PeekImageShape" not in graph and b"decoders__ImageSlice" not in graph
    plain = _chunks(ef.data.ImageFolder(root + "/train", image_size=SIZE), training=False)[0]
    np.testing.assert_array_equal(cropped, plain)


def test_evaluation_resizes_the_shorter_side_and_takes_the_center(photos):
    train = _train(photos)
    assert train.eval_crop == 0.875
    val = train.sibling(photos + "/val")  # how validation_data="…/val" and predict see a path
    assert val.eval_crop == 0.875 and val.augment is None
    once, twice = _chunks(val, training=False), _chunks(val, training=False)
    assert once[0].shape == (16, *SIZE, 3)
    np.testing.assert_array_equal(once[0], twice[0])  # deterministic
    # the same source unaugmented when evaluated: its center crop, not a random one
    np.testing.assert_array_equal(_chunks(train, training=False)[0], _chunks(train, training=False)[0])
    # a center crop of the resized image, not the whole image squeezed to SIZE
    squeezed = _chunks(ef.data.ImageFolder(photos + "/val", image_size=SIZE), training=False)
    assert not np.array_equal(squeezed[0], once[0])


def test_normalised_values_equal_numpys_on_the_same_pixels(photos):
    plain = _chunks(ef.data.ImageFolder(photos + "/val", image_size=SIZE), training=False)[0]
    source = ef.data.ImageFolder(photos + "/val", image_size=SIZE, normalize="imagenet")
    assert source.scale is None
    normalised = _chunks(source, training=False)[0]
    assert normalised.dtype == np.float16
    expected = (plain / 255.0 - MEAN) / STD
    np.testing.assert_allclose(normalised.astype(np.float64), expected, rtol=0, atol=4e-3)
    # explicit (mean, std), one value for every channel
    gray = ef.data.ImageFolder(photos + "/val", image_size=SIZE, normalize=(0.5, 0.25))
    np.testing.assert_allclose(
        _chunks(gray, training=False)[0].astype(np.float64), (plain / 255.0 - 0.5) / 0.25, rtol=0, atol=8e-3
    )


def test_the_flip_is_fused_into_the_normalisation(photos):
    flips = ef.data.ImageFolder(
        photos + "/val", image_size=SIZE, normalize="imagenet", augment=ef.data.Augment(flip=True)
    )
    plain = _chunks(
        ef.data.ImageFolder(photos + "/val", image_size=SIZE, normalize="imagenet"), training=False
    )[0]
    got = _chunks(flips, training=True)[0]
    flipped = [np.array_equal(g, p[:, ::-1]) for g, p in zip(got, plain, strict=True)]
    kept = [np.array_equal(g, p) for g, p in zip(got, plain, strict=True)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert 0 < sum(flipped) < len(got)


def test_bad_settings_name_the_argument(photos):
    aug = ef.data.Augment(random_resized_crop=(0.08, 1.0))
    with pytest.raises(ValueError, match="random_resized_crop needs image_size"):
        ef.data.ImageFolder(photos + "/train", augment=aug)
    with pytest.raises(ValueError, match="normalize='cifar'"):
        ef.data.ImageFolder(photos + "/train", image_size=SIZE, normalize="cifar")
    with pytest.raises(ValueError, match=r"Augment\(random_resized_crop=\(0.5, 2.0\)\)"):
        ef.data.Augment(random_resized_crop=(0.5, 2.0))
    with pytest.raises(ValueError, match="applies to encoded images"):
        ef.data.Arrays(np.zeros((4, 8, 8, 3), np.uint8), np.zeros(4, np.int32), augment=aug)


class Tiny(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3), strides=(2, 2))(x))
        return nn.Dense(4)(x.reshape((x.shape[0], -1)))


class Crash(RuntimeError):
    pass


def test_a_resumed_run_with_random_crops_ends_bit_exact(photos, tmp_path):
    def run(callbacks=()):
        trainer = ef.Trainer(Tiny(), optimizer=optax.adam(1e-2), seed=3)
        trainer.fit(
            _train(photos, normalize="imagenet"), epochs=2, batch_size=8, verbose=0, callbacks=list(callbacks)
        )
        return trainer

    reference = run()
    trainer_box = []

    def crash(batch, logs):
        if len(trainer_box) == 0 and batch == 3:
            trainer_box.append(batch)
            raise Crash

    with pytest.raises(Crash):
        run([BackupAndRestore(tmp_path / "b", save_freq=2), LambdaCallback(on_train_batch_end=crash)])
    resumed = run([BackupAndRestore(tmp_path / "b", save_freq=2)])
    leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(resumed.params)]
    expected = [np.asarray(a) for a in jax.tree_util.tree_leaves(reference.params)]
    for a, b in zip(leaves, expected, strict=True):
        np.testing.assert_array_equal(a, b)  # bit for bit on CPU
