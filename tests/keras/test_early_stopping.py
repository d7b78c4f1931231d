"""EarlyStopping, as keras/src/callbacks/early_stopping_test.py pins it down.

The direction cases of ``test_early_stopping`` are in test_monitor_callback.py (they hold for
every callback with a ``monitor``). Keras' tests assert only lower bounds on the epochs trained
(their losses are random); these use losses that never improve (``mode="max"`` on a falling
loss) or given sequences, and assert the exact epoch.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from easyfit.callbacks import EarlyStopping
from tests.helpers import kerasfit

data, trainer = kerasfit.data, kerasfit.trainer  # the module's fixtures


@pytest.fixture
def kept(trainer):
    """The trainer, its state put back after the test."""
    state = trainer.state
    yield trainer
    trainer.state = state


def _fit(trainer, data, callbacks, epochs):
    return trainer.fit(data[0], epochs=epochs, batch_size=100, verbose=0, callbacks=callbacks)


def _run(stopper, trainer, values, monitor="loss", stop_at=None):
    """Feeds ``values`` to the hooks as fit would, one epoch each, giving the parameters the
    epoch's index before its end; the number of epochs run."""
    trainer.stop_training = False
    stopper.set_model(trainer)
    stopper.on_train_begin({})
    epochs = 0
    for epoch, value in enumerate(values):
        epochs += 1
        state = trainer.state
        marked = jax.tree_util.tree_map(lambda p, e=epoch: jnp.full_like(p, e), state.params)
        trainer.state = state.replace(params=marked)
        stopper.on_epoch_end(epoch, {monitor: value})
        if epoch == stop_at:
            trainer.stop_training = True
        if trainer.stop_training:
            break
    stopper.on_train_end({})
    return epochs


def _marker(trainer):
    leaves = {float(np.asarray(p).flat[0]) for p in jax.tree_util.tree_leaves(trainer.state.params)}
    assert len(leaves) == 1
    return leaves.pop()


@pytest.mark.parametrize("patience", [0, 1, 2, 3])
def test_early_stopping_patience(kept, patience):
    # keras: early_stopping_test.py::test_early_stopping_patience
    stopper = EarlyStopping(monitor="loss", patience=patience)
    _run(stopper, kept, [10.0, 9.0, 8.0, 9.0, 8.9, 8.8, 8.7, 8.6, 8.5])
    assert stopper.stopped_epoch == max(patience, 1) + 2


def test_early_stopping_reuse(trainer, data):
    # keras: early_stopping_test.py::test_early_stopping_reuse
    stopper = EarlyStopping(monitor="loss", mode="max", patience=3)  # a falling loss never improves
    assert _fit(trainer, data, [stopper], epochs=20).epoch == [0, 1, 2, 3]
    assert _fit(trainer, data, [stopper], epochs=20).epoch == [0, 1, 2, 3]


def test_state_reset_across_fit_calls(trainer):
    # keras: early_stopping_test.py::test_state_reset_across_fit_calls
    stopper = EarlyStopping(monitor="loss", patience=3)
    stopper.set_model(trainer)
    stopper.on_train_begin({})
    stopper.best, stopper.wait, stopper.stopped_epoch, stopper.best_epoch = 0.1, 3, 5, 5
    stopper.best_weights = object()
    stopper.on_train_begin({})
    assert stopper.best is None and stopper.best_weights is None
    assert (stopper.wait, stopper.stopped_epoch, stopper.best_epoch) == (0, 0, 0)


def test_early_stopping_with_baseline(trainer, data):
    # keras: early_stopping_test.py::test_early_stopping_with_baseline
    stopper = EarlyStopping(monitor="loss", mode="max", patience=3, baseline=1e9)  # never beaten
    assert _fit(trainer, data, [stopper], epochs=20).epoch == [0, 1, 2]  # patience counts from epoch 0
    assert stopper.stopped_epoch == 2


def test_early_stopping_final_weights_when_restoring_model_weights(kept):
    # keras: early_stopping_test.py::test_early_stopping_final_weights_when_restoring_model_weights
    trainer = kept
    stopper = EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
    _run(stopper, trainer, [0.2, 0.15, 0.1, 0.11, 0.12], monitor="val_loss")
    assert _marker(trainer) == 2  # the best epoch's parameters

    # no epoch beats the baseline: stops after patience epochs, restores the best one
    stopper = EarlyStopping(monitor="val_loss", patience=5, baseline=0.5, restore_best_weights=True)
    epochs = _run(stopper, trainer, [0.9, 0.8, 0.7, 0.71, 0.72, 0.73], monitor="val_loss")
    assert epochs == 5 and _marker(trainer) == 2

    # another callback stops the training: the best weights are restored all the same
    stopper = EarlyStopping(monitor="val_loss", patience=5, baseline=0.5, restore_best_weights=True)
    epochs = _run(stopper, trainer, [0.9, 0.8, 0.7, 0.71, 0.72, 0.73], monitor="val_loss", stop_at=3)
    assert epochs == 4 and _marker(trainer) == 2


def test_early_stopping_with_start_from_epoch(trainer, data):
    # keras: early_stopping_test.py::test_early_stopping_with_start_from_epoch
    stopper = EarlyStopping(monitor="loss", mode="max", patience=3, start_from_epoch=2)
    assert len(_fit(trainer, data, [stopper], epochs=20).epoch) == 2 + 3 + 1
    stopper = EarlyStopping(monitor="loss", mode="max", patience=0, start_from_epoch=2)
    assert len(_fit(trainer, data, [stopper], epochs=20).epoch) == 2 + 2  # patience 0 stops at once


def test_early_stopping_unknown_monitor_raises_in_auto_mode(trainer, data):
    # keras: early_stopping_test.py::test_early_stopping (the monitor="unknown" case)
    with pytest.raises(ValueError, match="monitor='unknown'"):
        _fit(trainer, data, [EarlyStopping(monitor="unknown")], epochs=2)


def test_early_stopping_missing_monitor_warns_and_trains_on(trainer, data):
    # keras: early_stopping.py::get_monitor_value (a monitor of known direction missing from the logs)
    with pytest.warns(UserWarning, match="val_accuracy.*not available"):
        history = _fit(trainer, data, [EarlyStopping(monitor="val_accuracy", patience=0)], epochs=3)
    assert history.epoch == [0, 1, 2]  # no validation data: no val_accuracy, no stop
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        EarlyStopping(monitor="val_accuracy", mode="max")  # nothing to say before fit
