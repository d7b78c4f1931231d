"""Keras' BackupAndRestore behaviours (keras/src/callbacks/backup_and_restore_test.py), as easyfit
tests. Keras' interrupting callback becomes tests.helpers' crash_before, and Keras' canary layer
counting forward passes becomes the optimizer step count and the parameters themselves."""

from __future__ import annotations

import os

import numpy as np
import pytest
from flax import linen as nn

import easyfit as ef
from easyfit.callbacks import BackupAndRestore, LambdaCallback
from easyfit.callbacks.backup_and_restore import BACKUPS
from tests.helpers import Crash, crash_before, flat_params

EPOCH_STEPS = 3  # 10 samples in batches of 4, as in Keras' test


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return ef.data.Arrays(rng.random((10, 3), np.float32), rng.random((10, 1), np.float32))


def _trainer():
    return ef.Trainer(nn.Dense(1), optimizer="sgd", loss="mse", seed=0, steps_per_execution=1)


def _fit(trainer, data, callbacks, epochs):
    return trainer.fit(data, epochs=epochs, batch_size=4, verbose=0, callbacks=callbacks)


@pytest.fixture(scope="module")
def never_stopped(data):
    trainer = _trainer()
    _fit(trainer, data, [], epochs=5)
    return trainer


def _crash_after_epoch(n):
    """Raises as epoch n + 1 (1-based) begins: after every hook of epoch n (its backup too)."""

    def crash(epoch, logs):
        if epoch == n:
            raise Crash

    return LambdaCallback(on_epoch_begin=crash)


# Keras: test_save_freq_unknown_error
def test_an_unknown_save_freq_is_refused():
    for bad in ("batch", 0.15):
        with pytest.raises(ValueError, match="save_freq"):
            BackupAndRestore("backup_dir", save_freq=bad)


# Keras: test_best_case_step
def test_a_run_interrupted_mid_epoch_resumes_at_its_batch(tmp_path, data, never_stopped):
    backup_dir = tmp_path / "subdir"
    crashing = _trainer()
    with pytest.raises(Crash):
        _fit(
            crashing,
            data,
            [BackupAndRestore(backup_dir, save_freq=1), crash_before(crashing, 0, 2)],
            epochs=2,
        )
    assert backup_dir.exists()
    assert int(crashing.state.step) == 2  # interrupted after the second batch
    point = BackupAndRestore(backup_dir).restore_point()
    assert (point.epoch, point.batch) == (0, 2)
    resumed = _trainer()
    history = _fit(resumed, data, [BackupAndRestore(backup_dir, save_freq=1)], epochs=5)
    assert history.epoch[-1] == 4
    assert int(resumed.state.step) == 5 * EPOCH_STEPS  # every batch trained once, none twice
    np.testing.assert_array_equal(flat_params(resumed.params), flat_params(never_stopped.params))


# Keras: test_best_case_epoch
def test_a_run_interrupted_at_an_epoch_end_resumes_at_the_next_epoch(tmp_path, data, never_stopped):
    backup_dir = tmp_path / "subdir"
    crashing = _trainer()
    with pytest.raises(Crash):
        _fit(
            crashing, data, [BackupAndRestore(backup_dir, save_freq="epoch"), _crash_after_epoch(2)], epochs=6
        )
    assert backup_dir.exists()
    assert int(crashing.state.step) == 2 * EPOCH_STEPS
    resumed = _trainer()
    history = _fit(resumed, data, [BackupAndRestore(backup_dir)], epochs=5)
    assert history.epoch == [2, 3, 4]
    assert int(resumed.state.step) == 5 * EPOCH_STEPS
    np.testing.assert_array_equal(flat_params(resumed.params), flat_params(never_stopped.params))


def _corrupt_largest_file(backup):
    files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(backup, "state")) for f in fs]
    largest = max(files, key=os.path.getsize)
    with open(largest, "r+b") as f:
        f.write(b"0")


def _backups(backup_dir):
    return sorted(int(n) for n in os.listdir(backup_dir / BACKUPS) if n.isdigit())


# Keras: test_backup_corrupted
def test_with_double_checkpoint_a_corrupted_backup_falls_back_to_the_previous(tmp_path, data, never_stopped):
    backup_dir = tmp_path / "subdir"
    crashing = _trainer()
    with pytest.raises(Crash):
        _fit(
            crashing,
            data,
            [BackupAndRestore(backup_dir, save_freq="epoch", double_checkpoint=True), _crash_after_epoch(2)],
            epochs=6,
        )
    latest, previous = _backups(backup_dir)[::-1]  # the current and the previous state, both kept
    _corrupt_largest_file(backup_dir / BACKUPS / str(latest))
    resumed = _trainer()
    with pytest.warns(RuntimeWarning, match="is damaged, set aside"):
        history = _fit(resumed, data, [BackupAndRestore(backup_dir, double_checkpoint=True)], epochs=5)
    assert history.epoch == [1, 2, 3, 4]  # from the previous backup, after epoch 1
    assert history.epoch[-1] == 4
    assert int(resumed.state.step) == 5 * EPOCH_STEPS
    np.testing.assert_array_equal(flat_params(resumed.params), flat_params(never_stopped.params))


# Keras: test_backup_corrupted (double_checkpoint off, Keras' default: one backup only)
def test_without_double_checkpoint_only_the_latest_backup_is_kept(tmp_path, data):
    backup_dir = tmp_path / "subdir"
    crashing = _trainer()
    with pytest.raises(Crash):
        _fit(crashing, data, [BackupAndRestore(backup_dir), _crash_after_epoch(2)], epochs=6)
    assert len(_backups(backup_dir)) == 1


# Keras: test_model_deleted_case_epoch
def test_a_finished_fit_deletes_the_backup(tmp_path, data):
    backup_dir = tmp_path / "subdir"
    assert not backup_dir.exists()
    _fit(_trainer(), data, [BackupAndRestore(backup_dir, save_freq="epoch")], epochs=2)
    assert not backup_dir.exists()


# Keras: test_backup_dir_empty_error
def test_an_empty_backup_dir_is_refused():
    with pytest.raises(ValueError, match="empty backup_dir"):
        BackupAndRestore(backup_dir="", save_freq="epoch")


# Keras: test_backup_dir_none_error
def test_a_none_backup_dir_is_refused():
    with pytest.raises(ValueError, match="empty backup_dir"):
        BackupAndRestore(backup_dir=None, save_freq="epoch")
