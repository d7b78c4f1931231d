"""Callbacks' states through a backup: a fit stopped mid-epoch and resumed from its backup ends
with the parameters, learning rate and callback state of a fit never stopped, bit for bit (each
built-in callback that keeps state, and one of the user's through get_state/set_state); and an
epoch not validated on purpose (validation_freq) is never a best, nor a lack of improvement."""

from __future__ import annotations

import csv
import json
import warnings

import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.callbacks import (
    BackupAndRestore,
    Callback,
    CSVLogger,
    EarlyStopping,
    LearningRateScheduler,
    ModelCheckpoint,
    ReduceLROnPlateau,
    TensorBoard,
)
from easyfit.callbacks.callback_list import CallbackList
from easyfit.core.learning_rate import get_learning_rate
from easyfit.persistence.checkpoint import ResumePoint, read_metadata
from tests.helpers import Crash, crash_at, flat_params, untrained
from tests.helpers.models import TinyMLP

EPOCHS, BATCH = 3, 8  # 64 samples: 8 batches an epoch


@pytest.fixture(scope="module")
def data(mnist_arrays):
    (x, y), (xv, yv) = mnist_arrays["train"], mnist_arrays["val"]
    return ef.data.Arrays(x[:64], y[:64], scale=1 / 255), (xv[:16], yv[:16])


@pytest.fixture(scope="module")
def _module_trainer():
    adam = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)
    return ef.Trainer(TinyMLP(), optimizer=adam, seed=0)


class Counting(Callback):
    """A user's callback: counts what it saw (on_epoch_begin a second time for a resumed epoch
    must not count), and records the learning rate each on_epoch_begin sees."""

    def __init__(self):
        super().__init__()
        self.begun, self.batches, self.seen = 0, 0, []

    def get_state(self):
        return {"begun": self.begun, "batches": self.batches}

    def set_state(self, state):
        self.begun, self.batches = state["begun"], state["batches"]

    def on_epoch_begin(self, epoch, logs=None):
        self.begun += 1
        self.seen.append((epoch, get_learning_rate(self.model.state.opt_state)))

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1


def _scheduler(folder):
    calls = []

    def halve(epoch, lr):
        calls.append((epoch, lr))
        return lr * 0.5

    schedule = LearningRateScheduler(halve)
    schedule.calls = calls
    return schedule


def _callbacks(folder):
    """One of each built-in callback that keeps state, and a user's, writing into ``folder``;
    each keeps state that a resume without it would lose (the loss falls, so in "max" mode no
    epoch after the first improves: patience runs, the learning rate is reduced)."""
    return {
        "schedule": _scheduler(folder),
        "plateau": ReduceLROnPlateau("loss", factor=0.5, patience=1, mode="max", cooldown=1),
        "stop": EarlyStopping("loss", patience=5, mode="max", restore_best_weights=True),
        "best": ModelCheckpoint(folder / "best", "loss", mode="max", save_best_only=True),
        "batches": ModelCheckpoint(folder / "b{epoch}-{batch}", save_freq=5, max_to_keep=2),
        "csv": CSVLogger(folder / "log.csv"),
        "tensorboard": TensorBoard(folder / "tb", update_freq=3),
        "user": Counting(),
    }


def _fit(trainer, data, callbacks):
    train, _ = data
    return trainer.fit(train, epochs=EPOCHS, batch_size=BATCH, verbose=0, callbacks=callbacks)


def _csv(path):
    """The rows, without input_wait (a timing)."""
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if k != "input_wait"} for row in csv.DictReader(f)]


def test_a_mid_epoch_resume_keeps_every_callbacks_state(tmp_path, data, _module_trainer):
    ref_dir, run_dir, backup = tmp_path / "ref", tmp_path / "run", tmp_path / "backup"
    ref_dir.mkdir()
    run_dir.mkdir()
    trainer = untrained(_module_trainer)
    reference = _callbacks(ref_dir)
    _fit(trainer, data, list(reference.values()))
    ref_state = trainer.state

    trainer = untrained(_module_trainer)
    # the backup, listed first, runs last: it holds what the others did at that batch
    stopped = [BackupAndRestore(backup, save_freq=4), *_callbacks(run_dir).values(), crash_at(trainer, 1, 4)]
    with pytest.raises(Crash):
        _fit(trainer, data, stopped)
    point = BackupAndRestore(backup).restore_point()
    assert (point.epoch, point.batch) == (1, 4)  # mid-epoch

    trainer = untrained(_module_trainer)
    resumed = _callbacks(run_dir)  # a new process: new callbacks
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every state found its callback: nothing to warn about
        history = _fit(trainer, data, [*resumed.values(), BackupAndRestore(backup, save_freq=4)])
    assert history.epoch == [1, 2]
    assert int(trainer.state.step) == int(ref_state.step) == EPOCHS * 8
    assert np.array_equal(flat_params(trainer.state.params), flat_params(ref_state.params))
    assert np.array_equal(flat_params(trainer.state.opt_state), flat_params(ref_state.opt_state))
    # halved before each epoch, reduced after epochs 1 and 2
    assert get_learning_rate(trainer.state.opt_state) == get_learning_rate(ref_state.opt_state)
    assert get_learning_rate(ref_state.opt_state) == pytest.approx(1e-3 / 2**EPOCHS / 4)
    for name, callback in resumed.items():
        state, ref = callback.get_state(), reference[name].get_state()
        if state is not None and name != "csv":  # the paths the same but for the folder
            ours = json.dumps(state).replace(str(run_dir), "D")
            assert ours == json.dumps(ref).replace(str(ref_dir), "D"), name
    # the resumed epoch began as it did: the schedule saw the same rate
    assert resumed["schedule"].calls == reference["schedule"].calls[1:]
    assert resumed["user"].seen == reference["user"].seen[1:]
    assert resumed["user"].begun == EPOCHS and resumed["user"].batches == EPOCHS * 8
    assert resumed["stop"].best_epoch == 0  # its best weights (from the backup) restored at the end
    assert read_metadata(run_dir / "best")["epoch"] == 1  # the best of epoch 0, not overwritten
    assert sorted(p.name for p in run_dir.glob("b?-?")) == ["b2-7", "b3-4"]
    assert len(_csv(ref_dir / "log.csv")) == EPOCHS
    assert _csv(run_dir / "log.csv") == _csv(ref_dir / "log.csv")


def test_states_go_to_the_callbacks_by_class_and_order_and_what_does_not_match_warns():
    first, second = Counting(), Counting()
    first.batches, second.batches = 3, 5
    record = CallbackList([first, second, EarlyStopping("loss")], None, {}).resume_record()
    assert record["states"]["Counting"] == {"begun": 0, "batches": 3}
    assert record["states"]["Counting#2"] == {"begun": 0, "batches": 5}
    record["states"]["ReduceLROnPlateau"] = record["states"].pop("EarlyStopping")

    def resume(meta):
        return ResumePoint(1, 2, None, meta, read=None, source="the backup")

    again = [Counting(), Counting(), EarlyStopping("loss")]
    with pytest.warns(UserWarning) as caught:
        CallbackList(again, None, {}).restore(resume({"callbacks": record}))
    assert (again[0].batches, again[1].batches) == (3, 5)
    assert [str(w.message) for w in caught] == [
        "BackupAndRestore: the backup holds the state of ReduceLROnPlateau, which this fit's callbacks "
        "lack: not restored (pass the callbacks the backed-up fit had, in the same order)",
        "BackupAndRestore: the backup holds no state for EarlyStopping: started afresh",
    ]
    with pytest.warns(
        UserWarning, match=r"records no callback states \(written by an older easyfit\): Counting start"
    ):
        CallbackList([Counting()], None, {}).restore(resume({}))

    class Unsaved(Callback):
        def get_state(self):
            return {"seen": {1, 2}}

    with pytest.raises(TypeError, match=r"Unsaved.get_state\(\) must return plain JSON values"):
        CallbackList([Unsaved()], None, {}).resume_record()


def test_an_epoch_not_validated_by_validation_freq_is_neither_best_nor_worse(tmp_path, data, _module_trainer):
    """validation_freq=2: epochs 1 and 3 (1-based) are not validated. The best checkpoint is
    the validated epoch 4's, never an unvalidated one's; EarlyStopping's and
    ReduceLROnPlateau's patience count validated epochs; none of them warns."""
    trainer = untrained(_module_trainer)
    train, val = data
    best = ModelCheckpoint(tmp_path / "best", monitor="val_loss", save_best_only=True)
    stop = EarlyStopping(monitor="val_loss", mode="max", patience=1)  # val_loss falls: no improvement
    plateau = ReduceLROnPlateau(monitor="val_loss", mode="max", patience=1, factor=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        history = trainer.fit(
            train,
            epochs=4,
            batch_size=BATCH,
            validation_data=val,
            validation_freq=2,
            verbose=0,
            callbacks=[best, stop, plateau],
        )
    assert history.epoch == [0, 1, 2, 3] and len(history.history["val_loss"]) == 2
    assert history.history["val_loss"][1] < history.history["val_loss"][0]
    assert best.saved == [str(tmp_path / "best")] * 2  # epochs 2 and 4, not 1 and 3
    assert read_metadata(tmp_path / "best")["epoch"] == 4
    assert best.best == history.history["val_loss"][1]
    assert stop.stopped_epoch == 3  # the second validated epoch, not the third epoch
    assert get_learning_rate(trainer.state.opt_state) == pytest.approx(1e-3 / 2)  # reduced once
