"""ModelCheckpoint: Keras' behaviours, as keras/src/callbacks/model_checkpoint_test.py pins them
down (each test names its Keras case, see tests/keras/README.md), then easyfit's
``max_to_keep``.

easyfit saves an Orbax checkpoint directory, so Keras' ``.keras`` / ``.weights.h5`` suffix
checks (and the errors for a missing suffix) are not ported. Case 15 (``val_auc``) is not
ported: easyfit has no AUC metric. Case 6 (an unknown mode) is in test_monitor_callback.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import easyfit as ef
from easyfit.callbacks import ModelCheckpoint
from tests.helpers import flat_params, kerasfit
from tests.helpers.models import SmallMLP

data, trainer = kerasfit.data, kerasfit.trainer  # the module's fixtures


def _fit(trainer, data, callback, epochs=1, batch_size=50, validate=True):
    train, val = data
    return trainer.fit(
        train,
        epochs=epochs,
        batch_size=batch_size,
        verbose=0,
        validation_data=val if validate else None,
        callbacks=[callback],
    )


@pytest.mark.parametrize(
    ("monitor", "mode", "best_only"),
    [
        ("val_loss", "auto", False),
        ("val_loss", "min", False),
        ("val_accuracy", "max", False),
        ("val_accuracy", "max", True),
    ],
)
def test_model_checkpoint_options_saves(trainer, data, tmp_path, monitor, mode, best_only):
    # keras: model_checkpoint_test.py::test_model_checkpoint_options (cases 1 to 4), in a folder it creates
    path = tmp_path / "subdir" / "checkpoint"
    _fit(trainer, data, ModelCheckpoint(path, monitor=monitor, mode=mode, save_best_only=best_only))
    assert path.is_dir()


def test_best_only_with_a_monitor_not_in_the_logs_warns_and_saves(trainer, data, tmp_path):
    # keras: model_checkpoint_test.py::test_model_checkpoint_options (case 5: metric not available)
    path = tmp_path / "checkpoint"
    with pytest.warns(UserWarning, match="'unknown'"):
        _fit(trainer, data, ModelCheckpoint(path, monitor="unknown", save_best_only=True, mode="min"))
    assert path.is_dir()
    path = tmp_path / "auto"  # auto mode, val_loss, no validation data
    with pytest.warns(UserWarning, match="'val_loss'"):
        _fit(trainer, data, ModelCheckpoint(path, save_best_only=True), validate=False)
    assert path.is_dir()


def test_integer_save_freq_counts_batches_across_epochs(trainer, data, tmp_path):
    # keras: model_checkpoint_test.py::test_model_checkpoint_options (case 8a)
    pattern = str(tmp_path / "checkpoint.epoch{epoch:02d}")
    _fit(trainer, data, ModelCheckpoint(pattern, save_freq=8), epochs=4)  # 4 batches an epoch
    assert [os.path.isdir(pattern.format(epoch=e)) for e in (1, 2, 3, 4)] == [False, True, False, True]


def test_integer_save_freq_weights_only(trainer, data, tmp_path):
    # keras: model_checkpoint_test.py::test_model_checkpoint_options (case 8b)
    pattern = str(tmp_path / "checkpoint.epoch{epoch:02d}.weights")
    _fit(trainer, data, ModelCheckpoint(pattern, save_freq=8, save_weights_only=True), epochs=2)
    assert [os.path.isdir(pattern.format(epoch=e)) for e in (1, 2)] == [False, True]
    restored = ef.Trainer.from_checkpoint(pattern.format(epoch=2), SmallMLP(), optimizer=trainer.optimizer)
    np.testing.assert_array_equal(flat_params(restored.state.params), flat_params(trainer.state.params))


def test_save_freq_argument(tmp_path):
    # keras: model_checkpoint_test.py::test_model_checkpoint_options (case 9)
    with pytest.raises(ValueError, match="save_freq='invalid_save_freq'"):
        ModelCheckpoint(tmp_path / "c", save_freq="invalid_save_freq")
    ModelCheckpoint(tmp_path / "c", save_freq="epoch")
    ModelCheckpoint(tmp_path / "c", save_freq=3)


def test_batch_in_filepath(trainer, data, tmp_path):
    # keras: model_checkpoint_test.py::test_model_checkpoint_options (cases 10a, 10b)
    pattern = str(tmp_path / "checkpoint.epoch{epoch:02d}batch{batch:02d}")
    _fit(trainer, data, ModelCheckpoint(pattern, save_freq=1), epochs=2, batch_size=100)
    assert sorted(os.listdir(tmp_path)) == [
        os.path.basename(pattern.format(epoch=e, batch=b)) for e in (1, 2) for b in (1, 2)
    ]


@pytest.mark.parametrize(
    ("monitor", "mode", "threshold", "saved"),
    [
        ("val_accuracy", "max", -0.01, True),  # case 11
        ("val_loss", "auto", None, True),  # case 12
        ("val_loss", "min", 0, False),  # case 13: no loss beats 0
        ("val_loss", "auto", 0, False),  # case 14
    ],
)
def test_initial_value_threshold(trainer, data, tmp_path, monitor, mode, threshold, saved):
    # keras: model_checkpoint_test.py::test_model_checkpoint_options (cases 11 to 14)
    path = tmp_path / "checkpoint"
    callback = ModelCheckpoint(
        path, monitor=monitor, mode=mode, save_best_only=True, initial_value_threshold=threshold
    )
    _fit(trainer, data, callback)
    assert path.is_dir() == saved


def test_integer_save_freq_with_a_validation_monitor_saves(trainer, data, tmp_path):
    # keras: model_checkpoint.py::_should_save_model (batch logs hold no val_loss: warn, and save)
    pattern = str(tmp_path / "checkpoint.epoch{epoch:02d}batch{batch:02d}")
    with pytest.warns(UserWarning, match="'val_loss'"):
        _fit(trainer, data, ModelCheckpoint(pattern, save_best_only=True, save_freq=2), epochs=1)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.epoch01batch02", "checkpoint.epoch01batch04"]


def test_model_checkpoint_loading(trainer, data, tmp_path):
    # keras: model_checkpoint_test.py::test_model_checkpoint_loading
    for weights_only in (False, True):
        path = tmp_path / f"checkpoint-{weights_only}"
        _fit(trainer, data, ModelCheckpoint(path, save_best_only=True, save_weights_only=weights_only))
        restored = ef.Trainer.from_checkpoint(path, SmallMLP(), optimizer=trainer.optimizer)
        np.testing.assert_array_equal(flat_params(restored.state.params), flat_params(trainer.state.params))


def test_max_to_keep_keeps_the_newest_and_nothing_else_is_touched(trainer, data, tmp_path):
    # the disk does not grow without bound, and nothing the callback did not write is deleted
    os.makedirs(tmp_path / "ckpt" / "mine")  # the user's own folder beside the checkpoints
    keep = ModelCheckpoint(str(tmp_path / "ckpt" / "ep-{epoch}"), max_to_keep=2)
    _fit(trainer, data, keep, epochs=4, validate=False)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["ep-3", "ep-4", "mine"]
    assert [os.path.basename(p) for p in keep.saved] == ["ep-1", "ep-2", "ep-3", "ep-4"]  # every one written
    again = ef.Trainer.from_checkpoint(tmp_path / "ckpt" / "ep-4", SmallMLP(), optimizer=trainer.optimizer)
    assert int(again.state.step) == int(trainer.state.step)
    np.testing.assert_array_equal(flat_params(again.state.params), flat_params(trainer.state.params))


def test_max_to_keep_is_checked():
    with pytest.raises(ValueError, match="max_to_keep=0"):
        ModelCheckpoint("ckpt", max_to_keep=0)
