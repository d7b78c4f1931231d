"""Trainer(ema_momentum=m): a moving average of the parameters kept in the jitted step by Keras'
formula, used by evaluate, predict, export and the best-epoch callbacks, saved in checkpoints and
resumed bit for bit; the raw weights stay in ``state.params``."""

from __future__ import annotations

import os

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

import easyfit as ef
from easyfit.callbacks import BackupAndRestore, EarlyStopping, LambdaCallback, ModelCheckpoint
from easyfit.persistence.export import load_exported
from tests.helpers import Crash, crash_at, flat_params
from tests.helpers.models import TinyMLP as Tiny

N, B, M = 96, 12, 0.8  # 8 batches an epoch
#: the average against the same formula on the host: float32 rounding of a few products
RTOL, ATOL = 1e-6, 1e-7


@pytest.fixture(scope="module")
def arrays(mnist_arrays):
    x, y = mnist_arrays["train"]
    return (x[:N] / 255).astype(np.float32), y[:N]


def _trainer(k=None, momentum=M):
    return ef.Trainer(
        Tiny(),
        optimizer=optax.sgd(0.1, momentum=0.9),
        seed=0,
        steps_per_execution=1,
        ema_momentum=momentum,
        gradient_accumulation_steps=k,
    )


def _fit(trainer, x, y, callbacks=(), epochs=2, **kwargs):
    kwargs = {"batch_size": B, "epochs": epochs, "shuffle": False, "verbose": 0, **kwargs}
    trainer.fit(x, y, callbacks=list(callbacks), **kwargs)
    return trainer


@pytest.fixture(scope="module")
def trained(arrays):
    return _fit(_trainer(), *arrays)


@pytest.mark.parametrize("k", [None, 2], ids=["every-batch", "accumulating"])
def test_the_average_follows_keras_formula(arrays, k):
    # after every batch: ema = m * ema + (1 - m) * params, with m = 0 until an update was
    # made before the batch (the first batch; the first k with accumulation)
    trainer = _trainer(k)
    raw, averaged = [], []

    def record(batch, logs):
        raw.append(flat_params(jax.device_get(trainer.state.params)))
        averaged.append(flat_params(jax.device_get(trainer.state.ema_params)))

    _fit(trainer, *arrays, [LambdaCallback(on_train_batch_end=record)], epochs=1)
    first = k or 1
    expected = raw[first - 1]
    np.testing.assert_allclose(averaged[first - 1], expected, rtol=RTOL, atol=ATOL)
    for params, got in zip(raw[first:], averaged[first:], strict=True):
        expected = M * expected + (1 - M) * params
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
    assert not np.allclose(averaged[-1], raw[-1], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(flat_params(trainer.params), averaged[-1])


def test_evaluate_predict_and_export_use_the_average(trained, arrays, tmp_path):
    x, y = arrays
    ema, raw = trained.state.ema_params, trained.state.params
    outputs = trained.predict(x)
    np.testing.assert_allclose(outputs, Tiny().apply({"params": ema}, x), rtol=1e-5, atol=1e-6)
    assert not np.allclose(outputs, Tiny().apply({"params": raw}, x), rtol=1e-3, atol=1e-3)
    loss = optax.softmax_cross_entropy_with_integer_labels(outputs, y).mean()
    np.testing.assert_allclose(trained.evaluate(x, y)["loss"], loss, rtol=1e-5)
    run, _ = load_exported(trained.export(tmp_path / "exported"))
    np.testing.assert_allclose(np.asarray(run(x)), outputs, rtol=1e-5, atol=1e-6)


def test_checkpoints_keep_both_and_older_ones_load(trained, tmp_path):
    path = trained.save(tmp_path / "full")
    again = ef.Trainer.from_checkpoint(path, Tiny(), optimizer=optax.sgd(0.1, momentum=0.9), ema_momentum=M)
    assert np.array_equal(flat_params(again.state.params), flat_params(trained.state.params))
    assert np.array_equal(flat_params(again.state.ema_params), flat_params(trained.state.ema_params))
    # into a trainer without an average: the raw weights
    plain = ef.Trainer.from_checkpoint(path, Tiny(), optimizer=optax.sgd(0.1, momentum=0.9))
    assert plain.state.ema_params is None
    assert np.array_equal(flat_params(plain.params), flat_params(trained.state.params))
    # a checkpoint without an average (of a trainer without it, or an older easyfit's: the
    # state item holds the fields it always held): the average starts from the parameters
    old = plain.save(tmp_path / "plain")
    with ocp.PyTreeCheckpointer() as checkpointer:
        item = checkpointer.metadata(os.path.join(old, "state"))
    item = getattr(getattr(item, "item_metadata", item), "tree", item)
    assert sorted(item) == ["dynamic_scale", "model_state", "opt_state", "params", "rng", "step"]
    averaging = ef.Trainer.from_checkpoint(
        old, Tiny(), optimizer=optax.sgd(0.1, momentum=0.9), ema_momentum=M
    )
    assert np.array_equal(flat_params(averaging.state.ema_params), flat_params(trained.state.params))
    # weights only: the weights evaluation uses, the average
    weights = ef.Trainer.from_checkpoint(trained.save(tmp_path / "w", weights_only=True), Tiny())
    assert np.array_equal(flat_params(weights.params), flat_params(trained.state.ema_params))


def test_a_resume_restores_the_average_bit_exact(trained, arrays, tmp_path):
    backup = tmp_path / "backup"
    crashing = _trainer()
    with pytest.raises(Crash):
        _fit(crashing, *arrays, [BackupAndRestore(backup, save_freq=1), crash_at(crashing, 1, 2)])
    resumed = _fit(_trainer(), *arrays, [BackupAndRestore(backup, save_freq=1)])
    assert np.array_equal(flat_params(resumed.state.ema_params), flat_params(trained.state.ema_params))
    assert np.array_equal(flat_params(resumed.state.params), flat_params(trained.state.params))


def test_best_epoch_callbacks_judge_and_keep_the_average(arrays, tmp_path):
    # validation labels the model unlearns ((y + 1) % 10): the best epoch is the first, and
    # val_loss is that of the average (it is what evaluate gives)
    x, y = arrays
    wrong = (x, (y + 1) % 10)
    trainer = _trainer(momentum=0.5)
    callbacks = [
        ModelCheckpoint(tmp_path / "best", monitor="val_loss", save_best_only=True),
        EarlyStopping(monitor="val_loss", patience=5, restore_best_weights=True),
    ]
    history = _fit(trainer, x, y, callbacks, epochs=3, validation_data=wrong).history.history["val_loss"]
    assert int(np.argmin(history)) == 0 and history[-1] > history[0]
    np.testing.assert_allclose(trainer.evaluate(*wrong)["loss"], history[0], rtol=1e-5)
    best = ef.Trainer.from_checkpoint(
        tmp_path / "best", Tiny(), optimizer=optax.sgd(0.1, momentum=0.9), ema_momentum=0.5
    )
    np.testing.assert_allclose(best.evaluate(*wrong)["loss"], history[0], rtol=1e-5)


def test_bad_ema_momentum_names_the_argument():
    for bad in (-0.1, 1.5, "0.9", True):
        with pytest.raises(ValueError, match=r"ema_momentum=.*\[0, 1\]"):
            ef.Trainer(Tiny(), ema_momentum=bad)
