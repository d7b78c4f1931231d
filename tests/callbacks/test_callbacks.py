"""Keras' callbacks, each doing what its documentation says, on real fits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.callbacks import (
    CallbackList,
    EarlyStopping,
    LambdaCallback,
    LearningRateScheduler,
    ReduceLROnPlateau,
    TerminateOnNaN,
)
from tests.helpers import flat_params, untrained
from tests.helpers.models import SmallMLP


@pytest.fixture(scope="module")
def data(mnist_arrays):
    (x, y), (xv, yv) = mnist_arrays["train"], mnist_arrays["val"]
    return ef.data.Arrays(x[:600], y[:600], scale=1 / 255), (xv[:200], yv[:200])


@pytest.fixture(scope="module")
def _module_trainer():
    return ef.Trainer(
        SmallMLP(),
        optimizer=optax.inject_hyperparams(optax.adam)(learning_rate=1e-3),
        seed=0,
        steps_per_execution=1,
    )  # batch hooks at every step


@pytest.fixture
def trainer(_module_trainer):
    """One trainer (compiled once), given to each test untrained, its rate back at 1e-3: the
    fits within a test go on training it, those of other tests do not."""
    return untrained(_module_trainer)


def _fit(trainer, data, callbacks, epochs=4):
    train, val = data
    return trainer.fit(
        train, epochs=epochs, batch_size=100, verbose=0, validation_data=val, callbacks=callbacks
    )


def _stopped(trainer, data, **kw):
    stop = EarlyStopping(monitor="loss", mode="max", **kw)  # the loss falls: never improves
    history = _fit(trainer, data, [stop], epochs=6)
    return stop.stopped_epoch, history.epoch


def test_early_stopping_patience_baseline_start_and_min_delta(trainer, data):
    assert _stopped(trainer, data, patience=1) == (1, [0, 1])
    assert _stopped(trainer, data, patience=2) == (2, [0, 1, 2])
    assert _stopped(trainer, data, patience=2, baseline=1e9) == (1, [0, 1])  # never beaten
    assert _stopped(trainer, data, patience=1, start_from_epoch=2) == (3, [0, 1, 2, 3])
    stop = EarlyStopping(monitor="loss", patience=1, min_delta=1e9)  # no fall is enough
    assert _fit(trainer, data, [stop]).epoch == [0, 1]
    stop = EarlyStopping(monitor="loss", patience=1)  # falling: trains every epoch
    assert _fit(trainer, data, [stop], epochs=3).epoch == [0, 1, 2] and stop.stopped_epoch == 0
    with pytest.warns(UserWarning, match="'val_auc', which is not available"):
        _fit(trainer, data, [EarlyStopping(monitor="val_auc", mode="max")], epochs=1)


def test_early_stopping_restores_the_best_weights(trainer, data):
    seen = []
    keep = LambdaCallback(
        on_epoch_end=lambda epoch, logs: seen.append(flat_params(jax.device_get(trainer.params)))
    )
    stop = EarlyStopping(monitor="loss", mode="max", patience=2, restore_best_weights=True)
    _fit(trainer, data, [keep, stop])
    assert stop.best_epoch == 0 and len(seen) == 3
    assert np.array_equal(flat_params(trainer.params), seen[0])
    assert not np.array_equal(seen[0], seen[-1])


def test_learning_rate_scheduler_sets_the_optimizer_rate(trainer, data):
    history = _fit(trainer, data, [LearningRateScheduler(lambda epoch, lr: 1e-3 / (epoch + 1))], epochs=3)
    np.testing.assert_allclose(history.history["learning_rate"], [1e-3, 5e-4, 1e-3 / 3], rtol=1e-6)
    before = flat_params(trainer.params)
    _fit(trainer, data, [LearningRateScheduler(lambda epoch: 0.0)], epochs=1)  # one argument
    assert np.array_equal(flat_params(trainer.params), before)  # a zero rate moves nothing


def test_reduce_lr_on_plateau(trainer, data):
    reduce = ReduceLROnPlateau(monitor="loss", mode="max", factor=0.5, patience=1)
    lrs = _fit(trainer, data, [reduce]).history["learning_rate"]
    np.testing.assert_allclose(lrs, [1e-3, 1e-3, 5e-4, 2.5e-4], rtol=1e-6)
    _fit(trainer, data, [LearningRateScheduler(lambda epoch: 1e-3)], epochs=1)
    reduce = ReduceLROnPlateau(monitor="loss", mode="max", factor=0.5, patience=1, cooldown=2, min_lr=3e-4)
    lrs = _fit(trainer, data, [reduce], epochs=6).history["learning_rate"]
    np.testing.assert_allclose(lrs, [1e-3, 1e-3, 5e-4, 5e-4, 3e-4, 3e-4], rtol=1e-6)
    with pytest.raises(ValueError, match="factor"):
        ReduceLROnPlateau(factor=1.0)


def test_changing_the_rate_needs_an_injected_rate(data):
    plain = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1), seed=0, steps_per_execution=1)
    for callback in (ReduceLROnPlateau(), LearningRateScheduler(lambda epoch: 0.1)):
        with pytest.raises(ValueError, match="optax.inject_hyperparams"):
            _fit(plain, data, [callback], epochs=1)


def test_terminate_on_nan_stops_after_the_first_bad_batch(data):
    def nan_loss(outputs, labels):
        return jnp.log(-jnp.abs(outputs).sum(-1) - 1.0)  # log of a negative number

    trainer = ef.Trainer(SmallMLP(), loss=nan_loss, metrics=[], seed=0, steps_per_execution=1)
    history = _fit(trainer, data, [TerminateOnNaN()])
    assert history.epoch == [0] and int(trainer.state.step) == 1
    assert np.isnan(history.history["loss"][0])


def test_lambda_callback_calls_what_it_is_given_and_nothing_else(trainer, data):
    calls = []
    cb = LambdaCallback(
        on_train_begin=lambda logs: calls.append("begin"),
        on_epoch_end=lambda epoch, logs: calls.append(("epoch", epoch, "loss" in logs)),
        on_test_end=lambda logs: calls.append("test"),
    )
    cbs = CallbackList([cb], trainer, {})
    assert not cbs.wants("on_train_batch_end")  # no batch logs built for it
    _fit(trainer, data, [cb], epochs=2)
    assert calls == ["begin", "test", ("epoch", 0, True), "test", ("epoch", 1, True)]
    batches = []
    _fit(trainer, data, [LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b))], epochs=1)
    assert batches == list(range(6))


def test_no_batch_hook_unless_asked(tmp_path):
    from easyfit.callbacks import (
        BackupAndRestore,
        CSVLogger,
        History,
        ModelCheckpoint,
        TensorBoard,
    )

    def wants_batches(*callbacks):
        return CallbackList(list(callbacks), None, {}).wants("on_train_batch_end")

    per_epoch = [
        History(),
        CSVLogger(tmp_path / "a.csv"),
        EarlyStopping(),
        ReduceLROnPlateau(),
        LearningRateScheduler(lambda epoch: 0.1),
        ModelCheckpoint(tmp_path / "m"),
        BackupAndRestore(tmp_path / "b"),
        TensorBoard(tmp_path / "t"),
    ]
    assert not wants_batches(*per_epoch)
    for every_n in (
        ModelCheckpoint(tmp_path / "m", save_freq=5),
        BackupAndRestore(tmp_path / "b", save_freq=5),
        TensorBoard(tmp_path / "t", update_freq=5),
        TerminateOnNaN(),
    ):
        assert wants_batches(*per_epoch, every_n)
    with pytest.raises(ValueError, match="save_freq=0"):
        ModelCheckpoint(tmp_path / "m", save_freq=0)


def test_a_callback_names_what_is_missing_before_a_trainer_is_set():
    class Stopper(ef.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.trainer.stop_training = True

    with pytest.raises(RuntimeError, match="Stopper is not attached to a Trainer yet"):
        Stopper().on_epoch_end(0)
    trainer = ef.Trainer(SmallMLP())
    stopper = Stopper()
    stopper.set_trainer(trainer)
    stopper.on_epoch_end(0)
    assert trainer.stop_training and stopper.model is trainer
