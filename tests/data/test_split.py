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


def test_a_split_root_uses_the_split_instead_of_its_val_folder(trainer, format_roots):
    root = format_roots["webdataset"]
    history = trainer.fit(root, validation_split=0.1, epochs=1, batch_size=100, verbose=0)
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


@pytest.mark.parametrize("fraction", [1.5, -0.1, 0.0001])
def test_fractions_that_leave_nothing(fraction, xy):
    with pytest.raises(ValueError, match=f"validation_split={fraction}"):
        split_validation(ef.data.Arrays(*xy), fraction)
