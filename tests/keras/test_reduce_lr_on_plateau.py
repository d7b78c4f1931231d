"""ReduceLROnPlateau, as keras/src/callbacks/reduce_lr_on_plateau_test.py pins it down.

The optimizer holds its rate through ``optax.inject_hyperparams`` (docs/keras.md says why).
Keras' ``test_verbose_logging`` reads a logger; easyfit prints, as Keras' ``io_utils`` does
with interactive logging on, so the port reads stdout.
"""

from __future__ import annotations

import numpy as np
import pytest

from easyfit.callbacks import ReduceLROnPlateau
from easyfit.core.learning_rate import get_learning_rate, set_learning_rate
from tests.helpers import kerasfit
from tests.helpers.kerasfit import scheduled_trainer

data, shared = kerasfit.data, kerasfit.trainer  # the module's fixtures


@pytest.fixture
def trainer(shared):
    """The module's trainer, its rate back at 0.1."""
    shared.state = shared.state.replace(opt_state=set_learning_rate(shared.state.opt_state, 0.1))
    return shared


def _fit(trainer, data, callback, epochs):
    train, val = data
    trainer.fit(train, epochs=epochs, batch_size=100, verbose=0, validation_data=val, callbacks=[callback])
    return get_learning_rate(trainer.state.opt_state)


def test_reduces_lr_with_model_fit(trainer, data):
    # keras: reduce_lr_on_plateau_test.py::test_reduces_lr_with_model_fit
    reduce = ReduceLROnPlateau(patience=1, factor=0.1, monitor="val_loss", min_delta=100)
    np.testing.assert_allclose(_fit(trainer, data, reduce, epochs=2), 0.01, rtol=1e-6)


def test_throws_when_optimizer_has_schedule(data):
    # keras: reduce_lr_on_plateau_test.py::test_throws_when_optimizer_has_schedule
    reduce = ReduceLROnPlateau(patience=1, factor=0.1, monitor="val_loss", min_delta=100)
    with pytest.raises(TypeError, match="schedule"):
        _fit(scheduled_trainer(), data, reduce, epochs=2)


def test_verbose_logging(trainer, data, capsys):
    # keras: reduce_lr_on_plateau_test.py::test_verbose_logging
    reduce = ReduceLROnPlateau(patience=1, factor=0.1, monitor="val_loss", min_delta=100, verbose=1)
    _fit(trainer, data, reduce, epochs=2)
    assert "ReduceLROnPlateau reducing learning rate to 0.01" in capsys.readouterr().out


def test_honors_min_lr(trainer, data):
    # keras: reduce_lr_on_plateau_test.py::test_honors_min_lr
    reduce = ReduceLROnPlateau(patience=1, factor=0.1, monitor="val_loss", min_delta=10, min_lr=0.005)
    np.testing.assert_allclose(_fit(trainer, data, reduce, epochs=4), 0.005, rtol=1e-6)


def test_cooldown(trainer, data):
    # keras: reduce_lr_on_plateau_test.py::test_cooldown
    reduce = ReduceLROnPlateau(patience=1, factor=0.1, monitor="val_loss", min_delta=100, cooldown=2)
    np.testing.assert_allclose(_fit(trainer, data, reduce, epochs=4), 0.001, rtol=1e-6)  # 2 reductions


def test_state_reset_across_fit_calls(trainer):
    # keras: reduce_lr_on_plateau_test.py::test_state_reset_across_fit_calls
    reduce = ReduceLROnPlateau(patience=1, factor=0.1, monitor="loss", min_delta=0, cooldown=2)
    reduce.set_model(trainer)
    reduce.on_train_begin({})
    reduce.best, reduce.wait, reduce.cooldown_counter = 0.5, 3, 2
    reduce.on_train_begin({})
    assert reduce.best is None and (reduce.wait, reduce.cooldown_counter) == (0, 0)


def test_missing_monitor_warns_and_leaves_the_rate(trainer, data):
    # keras: reduce_lr_on_plateau.py::on_epoch_end (a monitor missing from the logs)
    reduce = ReduceLROnPlateau(patience=0, monitor="val_accuracy")
    with pytest.warns(UserWarning, match="val_accuracy.*not available"):
        rate = _fit(trainer, (data[0], None), reduce, epochs=2)
    np.testing.assert_allclose(rate, 0.1, rtol=1e-6)
