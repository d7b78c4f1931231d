"""LearningRateScheduler, as keras/src/callbacks/learning_rate_scheduler_test.py pins it down.

The optimizer holds its rate through ``optax.inject_hyperparams`` (docs/keras.md says why).
Keras' ``test_verbose_logging`` reads a logger; easyfit prints, so the port reads stdout.
"""

from __future__ import annotations

import numpy as np
import pytest

from easyfit.callbacks import LearningRateScheduler
from easyfit.core.learning_rate import get_learning_rate, set_learning_rate
from tests.helpers import kerasfit
from tests.helpers.kerasfit import scheduled_trainer

data, trainer = kerasfit.data, kerasfit.trainer  # the module's fixtures


@pytest.fixture(scope="module")
def train(data):
    return data[0]


def _fit(trainer, train, callback, epochs):
    history = trainer.fit(train, epochs=epochs, batch_size=100, verbose=0, callbacks=[callback])
    return get_learning_rate(trainer.state.opt_state), history


def test_updates_learning_rate(trainer, train):
    # keras: learning_rate_scheduler_test.py::test_updates_learning_rate
    rate, _ = _fit(
        trainer, train, LearningRateScheduler(lambda step: 1.0 / (2.0 + step), verbose=1), epochs=1
    )
    np.testing.assert_allclose(rate, 0.5, rtol=1e-7)


def test_verbose_logging(trainer, train, capsys):
    # keras: learning_rate_scheduler_test.py::test_verbose_logging
    _fit(trainer, train, LearningRateScheduler(lambda step: 1.0 / (1.0 + step), verbose=1), epochs=1)
    assert "LearningRateScheduler setting learning rate to 1.0" in capsys.readouterr().out


def test_schedule_dependent_on_previous_learning_rate(trainer, train):
    # keras: learning_rate_scheduler_test.py::test_schedule_dependent_on_previous_learning_rate
    trainer.state = trainer.state.replace(opt_state=set_learning_rate(trainer.state.opt_state, 0.03))
    rate, _ = _fit(trainer, train, LearningRateScheduler(lambda step, lr: lr / 2), epochs=2)
    np.testing.assert_allclose(rate, 0.03 / 4, rtol=1e-6)


def test_throws_when_optimizer_has_schedule(train):
    # keras: learning_rate_scheduler_test.py::test_throws_when_optimizer_has_schedule
    with pytest.raises(TypeError, match="schedule"):
        _fit(scheduled_trainer(), train, LearningRateScheduler(lambda step, lr: lr / 2), epochs=2)


def test_learning_rate_in_history(trainer, train):
    # keras: learning_rate_scheduler_test.py::test_learning_rate_in_history
    _, history = _fit(trainer, train, LearningRateScheduler(lambda step, lr: 0.5), epochs=1)
    assert type(history.history["learning_rate"][0]) is float
    assert history.history["learning_rate"][0] == 0.5


@pytest.mark.parametrize("value", [1, "0.1", None, np.array([0.1])])
def test_schedule_must_return_a_float(trainer, train, value):
    # keras: learning_rate_scheduler.py::_update_optimizer_lr (the schedule's output must be a float)
    with pytest.raises(ValueError, match="should be a float"):
        _fit(trainer, train, LearningRateScheduler(lambda step: value), epochs=1)
