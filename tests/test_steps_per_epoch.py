"""fit(steps_per_epoch=N): epochs of N steps cut from one stream of shuffled passes, exact on
resume, on 1 and 4 devices.

The inputs encode their index (``x[i] == i``) and a Trainer records, from inside the jitted
step, the valid rows of every step it trains (tests/helpers/stream.py).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.callbacks import BackupAndRestore, Callback
from tests.helpers import Crash, crash_at, flat_params, last_json, run_program
from tests.helpers.models import SmallMLP
from tests.helpers.stream import Recorder, fit_indexed, indexed, passes

N, B, SEED = 10, 4, 0  # a pass: 3 steps, the last one of 2 samples
PASS_ROWS = [4, 4, 2]


class Count(Callback):
    """The ``steps`` fit gives the callbacks, and the batches of each epoch."""

    def on_train_begin(self, logs=None):
        self.steps, self.batches = self.params["steps"], []

    def on_epoch_begin(self, epoch, logs=None):
        self.batches.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.batches[-1] += 1


def _trainer(k=1, cls=Recorder):
    return cls(SmallMLP(), optimizer=optax.adam(1e-2), seed=SEED, steps_per_execution=k)


def _fit(trainer, epochs, steps_per_epoch, callbacks=(), **kwargs):
    return fit_indexed(trainer, N, B, epochs, steps_per_epoch, callbacks, **kwargs)


@pytest.mark.parametrize(
    ("steps_per_epoch", "k"),
    [(2, 1), (5, 1), (5, 2), (2, 3)],
    ids=["shorter-than-a-pass", "longer", "longer-k2", "k-over-an-epoch"],
)
def test_epochs_go_on_through_the_stream_of_passes(steps_per_epoch, k):
    trainer, count = _trainer(k), Count()
    history = _fit(trainer, 3, steps_per_epoch, [count])
    dispatches = math.ceil(steps_per_epoch / k)
    assert count.steps == dispatches and count.batches == [dispatches] * 3
    assert history.epoch == [0, 1, 2]
    assert int(trainer.state.step) == 3 * steps_per_epoch  # the extra steps of a dispatch: skipped
    assert len(trainer.seen) == 3 * steps_per_epoch
    seen = trainer.stream()
    assert len(seen) == sum(PASS_ROWS[s % 3] for s in range(3 * steps_per_epoch))
    # epoch 2 starts where epoch 1 stopped, into the next pass and its own permutation
    np.testing.assert_array_equal(seen, passes(N, SEED, 6)[: len(seen)])


def test_only_the_epoch_ends_move():
    """3 epochs of 5 steps train the 15 steps of 5 passes: the same parameters, bit for bit (2
    steps a dispatch: some dispatches cross from one pass into the next)."""
    cut, whole = _trainer(2, ef.Trainer), _trainer(2, ef.Trainer)
    _fit(cut, 3, 5)
    _fit(whole, 5, None)
    assert int(cut.state.step) == int(whole.state.step) == 15
    np.testing.assert_array_equal(flat_params(cut.params), flat_params(whole.params))


def test_augmentation_draws_are_those_of_each_pass():
    """A sample's random draws are a function of (seed, pass, index): epochs cut elsewhere, and
    dispatches that cross from one pass into the next, augment as fit without steps_per_epoch."""
    images = np.random.default_rng(0).integers(0, 256, (N, 8, 8, 1), dtype=np.uint8)
    augment = ef.data.Augment(flip=True, rotation=15, brightness=0.3)
    cut, whole = _trainer(2, ef.Trainer), _trainer(2, ef.Trainer)
    for trainer, epochs, steps_per_epoch in ((cut, 3, 5), (whole, 5, None)):
        source = ef.data.Arrays(images, indexed(N)[1], scale=1 / 255, augment=augment)
        trainer.fit(source, batch_size=B, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=0)
    np.testing.assert_array_equal(flat_params(cut.params), flat_params(whole.params))


def test_the_device_cache_replays_the_same_stream(caplog):
    """Epochs shorter than a pass: the cache fills once every sample has streamed (in epoch 2),
    then gathers the same samples in the same steps."""
    streamed, cached = _trainer(), _trainer()
    _fit(streamed, 4, 2, cache=False)
    with caplog.at_level(logging.INFO, logger="easyfit"):
        _fit(cached, 4, 2, cache=True)
    assert any("samples cached on the device" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(cached.stream(), streamed.stream())
    np.testing.assert_array_equal(flat_params(cached.params), flat_params(streamed.params))


@pytest.mark.parametrize("k", [1, 2])
def test_a_backup_mid_epoch_resumes_bit_for_bit(tmp_path, k):
    reference = _trainer(k)
    _fit(reference, 3, 5)
    crashing = _trainer(k)
    with pytest.raises(Crash):
        _fit(crashing, 3, 5, [BackupAndRestore(tmp_path / "b", save_freq=2), crash_at(crashing, 1, 1)])
    point = BackupAndRestore(tmp_path / "b").restore_point()
    assert (point.epoch, point.batch) == (1, 1)  # mid-epoch
    resumed = _trainer(k)
    history = _fit(resumed, 3, 5, [BackupAndRestore(tmp_path / "b", save_freq=2)])
    assert history.epoch == [1, 2]
    assert int(resumed.state.step) == int(reference.state.step) == 15
    np.testing.assert_array_equal(flat_params(resumed.params), flat_params(reference.params))
    np.testing.assert_array_equal(
        flat_params(resumed.state.opt_state), flat_params(reference.state.opt_state)
    )
    done = point.meta["step"]  # the resumed run trained the reference's steps from the backup on
    assert len(resumed.seen) == len(reference.seen) - done
    for got, want in zip(resumed.seen, reference.seen[done:], strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_backup_at_an_epoch_end_and_initial_epoch_resume_bit_for_bit(tmp_path):
    reference = _trainer(cls=ef.Trainer)
    _fit(reference, 4, 2)
    crashing = _trainer(cls=ef.Trainer)

    backup = tmp_path / "b"
    with pytest.raises(Crash):
        _fit(crashing, 4, 2, [BackupAndRestore(backup), crash_at(crashing, 2, 1)])
    point = BackupAndRestore(backup).restore_point()
    assert (point.epoch, point.batch) == (2, 0)  # written at epoch 1's end
    with pytest.raises(ValueError, match="steps_per_epoch: 2 -> 3"):  # other epochs, other samples
        _fit(_trainer(cls=ef.Trainer), 4, 3, [BackupAndRestore(backup)])
    resumed = _trainer(cls=ef.Trainer)
    assert _fit(resumed, 4, 2, [BackupAndRestore(backup)]).epoch == [2, 3]
    np.testing.assert_array_equal(flat_params(resumed.params), flat_params(reference.params))
    going_on = _trainer(cls=ef.Trainer)  # Keras' initial_epoch: the same trainer, fit again
    _fit(going_on, 2, 2)
    assert _fit(going_on, 4, 2, initial_epoch=2).epoch == [2, 3]
    np.testing.assert_array_equal(flat_params(going_on.params), flat_params(reference.params))


def test_steps_per_epoch_must_be_a_positive_integer():
    for bad in (0, 2.5, "10"):
        with pytest.raises(ValueError, match=f"steps_per_epoch={bad!r}"):
            _fit(_trainer(cls=ef.Trainer), 1, bad)


@pytest.mark.slow
def test_on_four_devices(tmp_path, format_roots):
    lmdb = format_roots["lmdb"]  # the session's LMDB of MNIST: 1,000 training records
    r = last_json(run_program("steps_per_epoch_devices.py", str(tmp_path / "b"), lmdb, devices=4))
    assert r["devices"] == 4
    assert r["streams"] == {"2-1": True, "5-2": True}
    assert r["resumed_epochs"] == [1, 2] and r["resumed_point"] == [1, 1]
    assert r["resumed_identical"]
    assert r["reader_streams"] == {"1-4": True, "3-13": True}
