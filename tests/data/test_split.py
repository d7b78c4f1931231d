"""validation_split: seeded, disjoint, on any index-driven source; refused for readers."""

from __future__ import annotations

import os

import numpy as np
import pytest

import easyfit as ef
from easyfit.data.split import split_validation


@pytest.fixture(scope="module")
def xy(mnist_arrays):
    x, y = mnist_arrays["train"]
    return x[:1000], y[:1000]


def test_split_is_seeded_disjoint_complete_and_spread():
    data = ef.data.Arrays(np.arange(1000.0)[:, None], np.arange(1000) % 10)
    train, val = split_validation(data, 0.1, seed=3)
    again_train, again_val = split_validation(data, 0.1, seed=3)
    _, other = split_validation(data, 0.1, seed=4)
    assert len(val) == 100 and len(train) == 900
    np.testing.assert_array_equal(val.indices, again_val.indices)
    np.testing.assert_array_equal(train.indices, again_train.indices)
    assert not np.array_equal(val.indices, other.indices)
    assert not set(train.indices) & set(val.indices)
    assert sorted([*train.indices, *val.indices]) == list(range(1000))
    assert val.indices.min() < 300 and val.indices.max() > 700  # not just the last tenth


def test_fit_validates_on_the_held_out_arrays(trainer, xy):
    x, y = xy
    history = trainer.fit(x, y, validation_split=0.2, epochs=1, batch_size=100, verbose=0)
    _, val = split_validation(ef.data.Arrays(x, y), 0.2, seed=trainer.seed)
    again = trainer.evaluate(x[val.indices], y[val.indices], batch_size=100)
    assert again["loss"] == history.history["val_loss"][0]
    assert again["accuracy"] == history.history["val_accuracy"][0]


def test_a_root_with_its_own_val_folder_refuses_validation_split(trainer, format_roots):
    """Found trying easyfit as a new user: ``validation_split`` used to drop ``root/val``
    silently and validate on a part of ``train/``. Now it names both and which to drop."""
    root = format_roots["webdataset"]
    with pytest.raises(ValueError, match=r"validation_split=0\.1: .*train.* has its own validation data"):
        trainer.fit(root, validation_split=0.1, epochs=1, batch_size=100, verbose=0)
    history = trainer.fit(
        os.path.join(root, "train"), validation_split=0.1, epochs=1, batch_size=100, verbose=0
    )
    train = ef.data.WebDataset(os.path.join(root, "train"))
    _, val = split_validation(train, 0.1, seed=trainer.seed)
    again = trainer.evaluate(val, batch_size=100)
    assert again["loss"] == history.history["val_loss"][0]
    assert len(val) == 100


def test_validation_data_wins_over_validation_split(trainer, xy):
    x, y = xy
    history = trainer.fit(
        x[:800],
        y[:800],
        validation_data=(x[800:], y[800:]),
        validation_split=0.5,
        epochs=1,
        batch_size=100,
        verbose=0,
    )
    again = trainer.evaluate(x[800:], y[800:], batch_size=100)
    assert again["loss"] == history.history["val_loss"][0]


def test_reader_driven_sources_refuse_it(trainer, format_roots):
    lmdb = os.path.join(format_roots["lmdb"], "train")
    with pytest.raises(ValueError, match=f"validation_split: Caffe2LMDB.*{lmdb}"):
        trainer.fit(lmdb, validation_split=0.1, verbose=0)


@pytest.mark.parametrize("fraction", [1.5, -0.1, 0.0])
def test_fractions_out_of_range(fraction, xy):
    with pytest.raises(ValueError, match=f"validation_split={fraction}"):
        split_validation(ef.data.Arrays(*xy), fraction)


@pytest.mark.parametrize(
    ("n", "fraction", "held"),
    [(10, 0.25, 3), (100, 0.001, 1), (1000, 0.1, 100), (7, 0.5, 4)],
)
def test_arrays_hold_out_as_many_as_keras(n, fraction, held):
    """keras: data_adapter_utils_test.py::test_train_validation_split (Keras'
    ``train_validation_split`` trains on ``floor(n * (1 - f))`` rows, validates on the rest)."""
    train, val = split_validation(ef.data.Arrays(np.zeros((n, 1)), np.zeros(n, np.int32)), fraction)
    assert (len(train), len(val)) == (n - held, held)


def test_arrays_that_one_side_would_leave_empty_are_refused():
    with pytest.raises(ValueError, match="validation_split=0.99999: of 10 samples that leaves 0 "):
        split_validation(ef.data.Arrays(np.zeros((10, 1)), np.zeros(10, np.int32)), 0.99999)


def test_folders_hold_out_int_n_times_f_as_keras(tmp_path):
    """keras: image_dataset_utils_test.py::test_image_dataset_from_directory_validation_split
    (Keras' ``get_training_or_validation_split`` holds out ``int(n * f)`` files: 3 of 15 at 0.25,
    where a rounding count held out 4)."""
    from PIL import Image

    for c in range(3):
        os.makedirs(tmp_path / f"class_{c}")
        for i in range(5):
            Image.new("RGB", (4, 4), (c * 40, i * 20, 0)).save(tmp_path / f"class_{c}" / f"{i}.png")
    folder = ef.data.ImageFolder(str(tmp_path))
    train, val = split_validation(folder, 0.25)
    assert (len(train), len(val)) == (12, 3)
    with pytest.raises(ValueError, match="leaves 15 for training and 0 for validation"):
        split_validation(folder, 0.05)
