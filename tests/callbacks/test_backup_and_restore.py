"""BackupAndRestore. Exact resume: a run killed (SIGKILL), crashed or interrupted (Ctrl-C) and
started again ends with the parameters of a run never stopped, bit for bit on CPU. Then Keras'
behaviours (keras/src/callbacks/backup_and_restore_test.py; each test names its Keras case, see
tests/keras/README.md): Keras' interrupting callback becomes tests.helpers' crash_before, and
its canary layer counting forward passes the optimizer step count and the parameters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import optax
import pytest
from flax import linen as nn

import easyfit as ef
from easyfit.callbacks import BackupAndRestore, LambdaCallback
from easyfit.callbacks.backup_and_restore import BACKUPS
from tests.helpers import PROGRAMS, Crash, crash_at, crash_before, flat_params, last_json
from tests.helpers.internals import compilations, step_functions
from tests.helpers.models import SmallMLP


def _npz(path) -> list[np.ndarray]:
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


@pytest.mark.slow
def test_sigkill_mid_epoch_then_restart_gives_the_same_parameters(tmp_path, mnist_idx):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "PYTHONUNBUFFERED": "1"}
    program = [sys.executable, str(PROGRAMS / "train_resume.py"), mnist_idx]
    cmd = program + [str(tmp_path / "backup"), str(tmp_path / "resumed.npz"), "--delay", "0.15"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:  # 15 batches an epoch, a backup every 3: kill in epoch 1
            if line.split()[:3] == ["batch", "1", "7"]:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "resumed.npz").exists()
    point = BackupAndRestore(tmp_path / "backup").restore_point()
    assert point is not None and point.epoch == 1 and 0 < point.batch < 15  # mid-epoch
    # the run started again; then, in the same interpreter, a new Trainer trains the fit never
    # killed (its own backup folder): the reference
    again = subprocess.run(
        cmd + ["--reference", str(tmp_path / "ref"), str(tmp_path / "ref.npz")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    resumed = last_json(again)
    reference = resumed.pop("reference")
    assert reference["epochs"] == [0, 1]  # from the start, never stopped
    assert resumed["epochs"] == [1]  # only the epoch it resumed in was run again
    assert resumed["step"] == reference["step"]
    assert resumed["last"] == reference["last"]  # the epoch's metrics, restored mid-epoch
    for a, b in zip(_npz(tmp_path / "ref.npz"), _npz(tmp_path / "resumed.npz"), strict=True):
        assert np.array_equal(a, b)
    assert not (tmp_path / "backup").exists()  # deleted once training finished


K = 3  # steps per execution: 10 steps an epoch make 4 dispatches, the last one padded


@pytest.fixture(scope="module")
def data(mnist_arrays):
    (x, y), (xv, yv) = mnist_arrays["train"], mnist_arrays["val"]
    return ef.data.Arrays(x[:1000], y[:1000], scale=1 / 255), (xv[:200], yv[:200])


def _trainer():
    return ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=1, steps_per_execution=K)


def _fit(trainer, data, callbacks=(), epochs=2, batch_size=100):
    train, val = data
    return trainer.fit(
        train, epochs=epochs, batch_size=batch_size, verbose=0, validation_data=val, callbacks=list(callbacks)
    )


@pytest.fixture(scope="module")
def reference(data):
    trainer = _trainer()
    return trainer, _fit(trainer, data)


def test_crash_then_resume_mid_epoch(tmp_path, data, reference):
    ref, ref_history = reference
    trainer = _trainer()
    with pytest.raises(Crash):
        _fit(trainer, data, [BackupAndRestore(tmp_path / "b", save_freq=3), crash_at(trainer, 1, 2)])
    point = BackupAndRestore(tmp_path / "b").restore_point()
    assert (point.epoch, point.batch) == (1, 2)  # the backup of dispatch 6 of 8
    # a half-written backup (a save killed before its rename) is ignored:
    os.makedirs(tmp_path / "b" / BACKUPS / "99.orbax-checkpoint-tmp-1234567" / "state")
    resumed = _trainer()
    history = _fit(resumed, data, [BackupAndRestore(tmp_path / "b", save_freq=3)])
    assert history.epoch == [1]
    assert {k: v[-1] for k, v in history.history.items() if k != "input_wait"} == {
        k: v[-1] for k, v in ref_history.history.items() if k != "input_wait"
    }  # not a timing
    assert int(resumed.state.step) == int(ref.state.step)
    assert np.array_equal(flat_params(resumed.params), flat_params(ref.params))
    assert np.array_equal(flat_params(resumed.state.opt_state), flat_params(ref.state.opt_state))
    assert not (tmp_path / "b").exists()


def test_resume_at_an_epochs_shorter_last_dispatch(tmp_path, data, reference):
    """Resumed where only the epoch's last dispatch is left (10 steps = 3 + 3 + 3 + 1): the
    first dispatch trains 1 step with its own function, the next ones 3; the same parameters."""
    ref, _ = reference
    trainer = _trainer()
    with pytest.raises(Crash):
        _fit(trainer, data, [BackupAndRestore(tmp_path / "b", save_freq=1), crash_at(trainer, 0, 3)])
    point = BackupAndRestore(tmp_path / "b").restore_point()
    assert (point.epoch, point.batch) == (0, 3)
    resumed = _trainer()
    history = _fit(resumed, data, [BackupAndRestore(tmp_path / "b")])
    assert history.epoch == [0, 1]
    assert int(resumed.state.step) == int(ref.state.step) == 20
    assert np.array_equal(flat_params(resumed.params), flat_params(ref.params))
    fns = step_functions(resumed)
    assert compilations(fns.train(1)) == compilations(fns.train(3)) == 1


def test_ctrl_c_backs_up_runs_on_train_end_and_reraises(tmp_path, data, reference):
    ended = []
    trainer = _trainer()

    def press_ctrl_c(batch, logs):
        if trainer.progress.epoch == 0 and batch == 1:
            signal.raise_signal(signal.SIGINT)  # to this, the main, thread: as a Ctrl-C

    callbacks = [
        BackupAndRestore(tmp_path / "b"),  # backs up at epoch ends, and on Ctrl-C
        LambdaCallback(on_train_batch_end=press_ctrl_c, on_train_end=lambda logs: ended.append(True)),
    ]
    # Python's own Ctrl-C handler, as in a terminal: a process started in the background
    # (pytest under `cmd &`) inherits SIGINT ignored, which easyfit leaves alone
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            _fit(trainer, data, callbacks)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert ended == [True]
    assert int(trainer.state.step) == 2 * K  # stopped after the dispatch in progress
    point = BackupAndRestore(tmp_path / "b").restore_point()
    assert (point.epoch, point.batch) == (0, 2)
    resumed = _trainer()
    assert _fit(resumed, data, [BackupAndRestore(tmp_path / "b")]).epoch == [0, 1]
    assert np.array_equal(flat_params(resumed.params), flat_params(reference[0].params))


def test_backup_kept_on_request_and_refused_for_other_batching(tmp_path, data):
    trainer = _trainer()
    _fit(trainer, data, [BackupAndRestore(tmp_path / "b", delete_checkpoint=False)], epochs=1)
    point = BackupAndRestore(tmp_path / "b").restore_point()
    assert (point.epoch, point.batch) == (1, 0)
    with pytest.raises(ValueError, match="batch_size: 100 -> 50"):
        _fit(_trainer(), data, [BackupAndRestore(tmp_path / "b")], batch_size=50)


# Keras' behaviours, on a Dense(1) regression: 10 samples in batches of 4, as in Keras' tests.

EPOCH_STEPS = 3


@pytest.fixture(scope="module")
def dense_data():
    rng = np.random.default_rng(0)
    return ef.data.Arrays(rng.random((10, 3), np.float32), rng.random((10, 1), np.float32))


def _dense_trainer():
    return ef.Trainer(nn.Dense(1), optimizer="sgd", loss="mse", seed=0, steps_per_execution=1)


def _dense_fit(trainer, data, callbacks, epochs):
    return trainer.fit(data, epochs=epochs, batch_size=4, verbose=0, callbacks=callbacks)


@pytest.fixture(scope="module")
def never_stopped(dense_data):
    trainer = _dense_trainer()
    _dense_fit(trainer, dense_data, [], epochs=5)
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
def test_a_run_interrupted_mid_epoch_resumes_at_its_batch(tmp_path, dense_data, never_stopped):
    backup_dir = tmp_path / "subdir"
    crashing = _dense_trainer()
    with pytest.raises(Crash):
        _dense_fit(
            crashing,
            dense_data,
            [BackupAndRestore(backup_dir, save_freq=1), crash_before(crashing, 0, 2)],
            epochs=2,
        )
    assert backup_dir.exists()
    assert int(crashing.state.step) == 2  # interrupted after the second batch
    point = BackupAndRestore(backup_dir).restore_point()
    assert (point.epoch, point.batch) == (0, 2)
    resumed = _dense_trainer()
    history = _dense_fit(resumed, dense_data, [BackupAndRestore(backup_dir, save_freq=1)], epochs=5)
    assert history.epoch[-1] == 4
    assert int(resumed.state.step) == 5 * EPOCH_STEPS  # every batch trained once, none twice
    np.testing.assert_array_equal(flat_params(resumed.params), flat_params(never_stopped.params))


# Keras: test_best_case_epoch
def test_a_run_interrupted_at_an_epoch_end_resumes_at_the_next_epoch(tmp_path, dense_data, never_stopped):
    backup_dir = tmp_path / "subdir"
    crashing = _dense_trainer()
    with pytest.raises(Crash):
        callbacks = [BackupAndRestore(backup_dir, save_freq="epoch"), _crash_after_epoch(2)]
        _dense_fit(crashing, dense_data, callbacks, epochs=6)
    assert backup_dir.exists()
    assert int(crashing.state.step) == 2 * EPOCH_STEPS
    resumed = _dense_trainer()
    history = _dense_fit(resumed, dense_data, [BackupAndRestore(backup_dir)], epochs=5)
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
def test_with_double_checkpoint_a_corrupted_backup_falls_back_to_the_previous(
    tmp_path, dense_data, never_stopped
):
    backup_dir = tmp_path / "subdir"
    crashing = _dense_trainer()
    with pytest.raises(Crash):
        _dense_fit(
            crashing,
            dense_data,
            [BackupAndRestore(backup_dir, save_freq="epoch", double_checkpoint=True), _crash_after_epoch(2)],
            epochs=6,
        )
    latest, previous = _backups(backup_dir)[::-1]  # the current and the previous state, both kept
    _corrupt_largest_file(backup_dir / BACKUPS / str(latest))
    resumed = _dense_trainer()
    with pytest.warns(RuntimeWarning, match="is damaged, set aside"):
        callbacks = [BackupAndRestore(backup_dir, double_checkpoint=True)]
        history = _dense_fit(resumed, dense_data, callbacks, epochs=5)
    assert history.epoch == [1, 2, 3, 4]  # from the previous backup, after epoch 1
    assert history.epoch[-1] == 4
    assert int(resumed.state.step) == 5 * EPOCH_STEPS
    np.testing.assert_array_equal(flat_params(resumed.params), flat_params(never_stopped.params))


# Keras: test_backup_corrupted (double_checkpoint off, Keras' default: one backup only)
def test_without_double_checkpoint_only_the_latest_backup_is_kept(tmp_path, dense_data):
    backup_dir = tmp_path / "subdir"
    crashing = _dense_trainer()
    with pytest.raises(Crash):
        _dense_fit(crashing, dense_data, [BackupAndRestore(backup_dir), _crash_after_epoch(2)], epochs=6)
    assert len(_backups(backup_dir)) == 1


# Keras: test_model_deleted_case_epoch
def test_a_finished_fit_deletes_the_backup(tmp_path, dense_data):
    backup_dir = tmp_path / "subdir"
    assert not backup_dir.exists()
    _dense_fit(_dense_trainer(), dense_data, [BackupAndRestore(backup_dir, save_freq="epoch")], epochs=2)
    assert not backup_dir.exists()


# Keras: test_backup_dir_empty_error
def test_an_empty_backup_dir_is_refused():
    with pytest.raises(ValueError, match="empty backup_dir"):
        BackupAndRestore(backup_dir="", save_freq="epoch")


# Keras: test_backup_dir_none_error
def test_a_none_backup_dir_is_refused():
    with pytest.raises(ValueError, match="empty backup_dir"):
        BackupAndRestore(backup_dir=None, save_freq="epoch")
