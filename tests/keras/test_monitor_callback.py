"""What counts as an improvement for EarlyStopping, ModelCheckpoint and ReduceLROnPlateau
(keras/src/callbacks/monitor_callback_test.py, and the direction cases of
early_stopping_test.py::test_early_stopping), with Keras' rule for ``mode="auto"``: ``loss`` and
``val_loss`` are minimised; another metric goes the way it declares (Keras' ``_direction``:
easyfit's named metrics declare it, a custom metric may); anything else raises ValueError.

Not ported: the cases of ``hinge`` and ``F1Score`` (easyfit has no metric of those names).
"""

from __future__ import annotations

import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.callbacks import EarlyStopping, ModelCheckpoint, ReduceLROnPlateau
from easyfit.callbacks._monitor import Monitor
from tests.helpers import untrained
from tests.helpers.models import SmallMLP


def iou(a, b):  # symmetric in its arguments, a custom metric of no declared direction
    return (a * b).sum(-1) / (a + b).sum(-1)


def r2(a, b):
    return (a - b).mean(-1) ** 2


def dice(a, b):
    return 2 * (a * b).sum(-1)


def gain(a, b):
    return (a * b).mean(-1)


gain._direction = "up"  # Keras' attribute: a custom metric saying that higher is better


@pytest.fixture(scope="module")
def _module_trainer():
    return ef.Trainer(
        SmallMLP(),
        optimizer=optax.inject_hyperparams(optax.sgd)(learning_rate=0.01),
        loss="categorical_crossentropy",
        metrics=["mse", "acc", "accuracy", "mae", iou, r2, dice, gain],
        seed=0,
        steps_per_execution=1,
    )


@pytest.fixture
def trainer(_module_trainer):
    """The module's trainer (compiled once), given to each test untrained."""
    return untrained(_module_trainer)


@pytest.fixture(scope="module")
def data(mnist_arrays):
    (x, y), (xv, yv) = mnist_arrays["train"], mnist_arrays["val"]
    one_hot = np.eye(10, dtype=np.float32)
    return (
        ef.data.Arrays(x[:100], one_hot[y[:100]], scale=1 / 255),
        ef.data.Arrays(xv[:50], one_hot[yv[:50]], scale=1 / 255),
    )


def _callback(kind, monitor, mode, tmp_path):
    if kind is ModelCheckpoint:
        return ModelCheckpoint(tmp_path / "ckpt", monitor=monitor, mode=mode, save_best_only=True)
    return kind(monitor=monitor, mode=mode, patience=5)


CASES = [
    ("max", "val_mse", np.greater),
    ("min", "val_loss", np.less),
    ("auto", "val_mse", np.less),
    ("auto", "loss", np.less),
    ("auto", "acc", np.greater),
    ("auto", "val_accuracy", np.greater),
    ("auto", "mae", np.less),
    ("auto", "val_gain", np.greater),
    ("max", "iou", np.greater),
]


@pytest.mark.parametrize("kind", [EarlyStopping, ModelCheckpoint, ReduceLROnPlateau])
def test_monitor_op_logic(trainer, data, tmp_path, kind):
    # keras: monitor_callback_test.py::test_monitor_op_logic (and early_stopping_test.py::test_early_stopping)
    train, val = data
    for mode, monitor, op in CASES:
        cb = _callback(kind, monitor, mode, tmp_path)
        trainer.fit(train, epochs=1, batch_size=50, validation_data=val, callbacks=[cb], verbose=0)
        assert cb.monitor_op is op, (mode, monitor)


@pytest.mark.parametrize("kind", [EarlyStopping, ModelCheckpoint, ReduceLROnPlateau])
@pytest.mark.parametrize("monitor", ["unknown", "iou", "r2", "dice", "val_dice"])
def test_auto_mode_raises_for_a_metric_of_no_direction(trainer, data, tmp_path, kind, monitor):
    # keras: monitor_callback_test.py::test_monitor_op_logic (the "unknown" case): no guess from the name
    train, val = data
    with pytest.raises(ValueError, match=f"monitor={monitor!r}.*mode='max'"):
        trainer.fit(
            train,
            epochs=1,
            batch_size=50,
            validation_data=val,
            callbacks=[_callback(kind, monitor, "auto", tmp_path)],
        )


@pytest.mark.parametrize("kind", [EarlyStopping, ModelCheckpoint, ReduceLROnPlateau])
def test_unknown_mode_warns_and_falls_back_to_auto(kind, tmp_path):
    # keras: model_checkpoint_test.py::test_model_checkpoint_options (case 6) and monitor_callback.py
    with pytest.warns(UserWarning, match=f"{kind.__name__} mode 'unknown' is unknown, fallback to auto mode"):
        cb = _callback(kind, "val_loss", "unknown", tmp_path)
    assert cb.mode == "auto"


def test_min_delta():
    # keras: monitor_callback_test.py::test_min_delta
    monitor = Monitor("val_loss", mode="max", min_delta=0.5)
    assert monitor.improved(0.75, 0)
    assert monitor.improved(0.5, None)
    assert not monitor.improved(0.5, 0)
    assert not monitor.improved(0.2, 0.5)


def test_custom_metric_direction_is_read_from_the_metric_itself(trainer, data):
    # keras: monitor_callback.py::_set_monitor_op (a metric's `_direction`, not its name)
    trainer.fit(data[0], epochs=1, batch_size=50, verbose=0)
    assert trainer.metric_direction("gain") == "up"
    assert trainer.metric_direction("accuracy") == "up" and trainer.metric_direction("mse") == "down"
    assert trainer.metric_direction("iou") is None and trainer.metric_direction("nothing") is None


def test_every_named_metric_declares_its_direction():
    # keras: monitor_callback.py::_set_monitor_op (Keras' built-in metrics each set `_direction`)
    from easyfit.core.metrics import _BY_NAME, _DIRECTIONS

    assert set(_DIRECTIONS) == set(_BY_NAME)
