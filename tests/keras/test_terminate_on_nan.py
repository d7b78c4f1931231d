"""TerminateOnNaN, as keras/src/callbacks/terminate_on_nan_test.py pins it down.

The loss turns infinite on its own here (regression targets of 1e30, whose square overflows
float32), not through huge initial weights. easyfit differs on purpose in one point
(docs/keras.md): ``on_train_end`` runs after a failure too, so that callbacks close files and
release locks; a callback tells a failure by ``sys.exc_info()`` in ``on_train_end``.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from easyfit.callbacks import BackupAndRestore, Callback, TerminateOnNaN
from easyfit.callbacks.backup_and_restore import BACKUPS
from tests.helpers.kerasfit import exploding_data, mse_trainer


class _Steps(Callback):
    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(batch)


@pytest.fixture
def mse(mnist_arrays):
    return mse_trainer(mnist_arrays)


def _fit(trainer, data, callbacks, epochs=2, batch_size=50):
    return trainer.fit(
        data, epochs=epochs, batch_size=batch_size, shuffle=False, verbose=0, callbacks=callbacks
    )


def test_terminate_on_nan(mse, mnist_arrays):
    # keras: terminate_on_nan_test.py::test_TerminateOnNaN
    history = _fit(mse, exploding_data(mnist_arrays), [TerminateOnNaN()], epochs=20)
    assert len(history.history["loss"]) == 1 and not np.isfinite(history.history["loss"][0])
    assert mse.stop_training


def test_terminate_on_nan_graceful_stop(mse, mnist_arrays):
    # keras: terminate_on_nan_test.py::test_terminate_on_nan_graceful_stop
    steps = []
    stop = TerminateOnNaN()  # stops after the 4th batch (samples 150 to 199)
    history = _fit(mse, exploding_data(mnist_arrays), [stop, _Steps(steps)], epochs=2)
    assert history.epoch == [0] and steps == [0, 1, 2, 3]


def test_terminate_on_nan_raise_error_raises_error(mse, mnist_arrays):
    # keras: terminate_on_nan_test.py::test_terminate_on_nan_raise_error_raises_error
    with pytest.raises(RuntimeError, match="NaN or Inf loss encountered"):
        _fit(mse, exploding_data(mnist_arrays, bad_from=0), [TerminateOnNaN(raise_error=True)])


def test_raise_error_terminate_and_on_train_end(mse, mnist_arrays):
    # keras: terminate_on_nan_test.py::test_raise_error_terminate_does_not_trigger_on_train_end.
    # easyfit differs on purpose (docs/keras.md): on_train_end runs, with the error in sys.exc_info()
    class Tracking(Callback):
        def __init__(self):
            super().__init__()
            self.failure = None

        def on_train_end(self, logs=None):
            self.failure = sys.exc_info()[0]

    tracking = Tracking()
    with pytest.raises(RuntimeError):
        _fit(mse, exploding_data(mnist_arrays, bad_from=0), [tracking, TerminateOnNaN(raise_error=True)])
    assert tracking.failure is RuntimeError


def test_raise_error_terminate_preserves_backup(mse, mnist_arrays, tmp_path):
    # keras: terminate_on_nan_test.py::test_raise_error_terminate_preserves_backup
    backup_dir = tmp_path / "backups"
    backup = BackupAndRestore(backup_dir, save_freq=1)
    with pytest.raises(RuntimeError):
        _fit(mse, exploding_data(mnist_arrays), [backup, TerminateOnNaN(raise_error=True)])
    # a backup to resume from, not only its (marked) directory: backup_dir/easyfit-backups/<step>
    assert any(s.isdigit() for s in os.listdir(backup_dir / BACKUPS))
    assert BackupAndRestore(backup_dir).restore_point() is not None


@pytest.mark.parametrize("raise_error", [False, True])
def test_normal_training_does_not_raise(mse, mnist_arrays, raise_error):
    # keras: terminate_on_nan_test.py::test_normal_training_does_not_raise
    history = _fit(mse, exploding_data(mnist_arrays, bad_from=200), [TerminateOnNaN(raise_error=raise_error)])
    assert len(history.history["loss"]) == 2


def test_raise_error_terminate_stops_on_later_batch(mse, mnist_arrays):
    # keras: terminate_on_nan_test.py::test_raise_error_terminate_stops_on_later_batch
    seen = []
    with pytest.raises(RuntimeError, match="at batch 3"):
        _fit(mse, exploding_data(mnist_arrays), [_Steps(seen), TerminateOnNaN(raise_error=True)])
    assert seen == [0, 1, 2, 3]
