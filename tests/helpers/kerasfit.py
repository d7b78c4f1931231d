"""Small fits for the ports of Keras' callback tests (tests/keras/): slices of the MNIST sample
and a SmallMLP, whose steps compile once for all of them. A module uses the fixtures
``data`` and ``trainer`` by importing them."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.callbacks import Callback
from tests.helpers.models import SmallMLP


def mnist_slices(mnist_arrays, train: int = 200, val: int = 100) -> tuple[ef.data.Arrays, ef.data.Arrays]:
    """The first ``train`` training and ``val`` test images of the sample, scaled to [0, 1]."""
    (x, y), (xv, yv) = mnist_arrays["train"], mnist_arrays["val"]
    return ef.data.Arrays(x[:train], y[:train], scale=1 / 255), ef.data.Arrays(
        xv[:val], yv[:val], scale=1 / 255
    )


def small_trainer(learning_rate=1e-3, **kwargs) -> ef.Trainer:
    """A SmallMLP with an injected Adam rate (the LR callbacks can set it), one step per
    dispatch (a batch hook per step)."""
    kwargs.setdefault("steps_per_execution", 1)
    optimizer = optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate)
    return ef.Trainer(SmallMLP(), optimizer=optimizer, seed=0, **kwargs)


_SHARED: dict[str, object] = {}


@pytest.fixture(scope="module")
def data(mnist_arrays) -> tuple[ef.data.Arrays, ef.data.Arrays]:
    """Training and validation slices (``mnist_slices``), the same for every module."""
    if "data" not in _SHARED:
        _SHARED["data"] = mnist_slices(mnist_arrays)
    return _SHARED["data"]  # type: ignore[return-value]


@pytest.fixture
def trainer(data) -> ef.Trainer:
    """One ``small_trainer`` for every module that uses the fixture (its steps compile once),
    given to each test as a first epoch (batches of 100) left it: the same parameters,
    optimizer state and rate (1e-3), whatever the tests before did with it."""
    if "trainer" not in _SHARED:
        shared = small_trainer()
        shared.fit(data[0], epochs=1, batch_size=100, verbose=0, validation_data=data[1])
        _SHARED["trainer"] = (shared, _copy(shared.state))
    shared, state = _SHARED["trainer"]  # type: ignore[misc]
    shared.state, shared.stop_training = _copy(state), False  # a copy: fit donates the state
    return shared


def _copy(tree):
    return jax.tree_util.tree_map(jnp.copy, tree)


def exploding_data(mnist_arrays, bad_from: int = 150, n: int = 200) -> ef.data.Arrays:
    """Regression targets of 0, and from sample ``bad_from`` on 1e30: an mse of those rows
    overflows float32 to inf (fit with ``shuffle=False`` to know the batch). One source per
    ``bad_from``, kept: its loader is built once."""
    key = f"exploding-{bad_from}-{n}"
    if key not in _SHARED:
        x = mnist_arrays["train"][0][:n]
        y = np.zeros((n, 10), np.float32)
        y[bad_from:] = 1e30
        _SHARED[key] = ef.data.Arrays(x, y, scale=1 / 255)
    return _SHARED[key]  # type: ignore[return-value]


def mse_trainer(mnist_arrays) -> ef.Trainer:
    """A SmallMLP with an mse loss (compiled once, shared by the modules that make the loss
    infinite), back at its first parameters: not those an infinite loss left."""
    if "mse" not in _SHARED:
        trainer = ef.Trainer(SmallMLP(), loss="mse", seed=0, steps_per_execution=1)
        trainer.fit(exploding_data(mnist_arrays, bad_from=200), epochs=0, batch_size=50, verbose=0)
        _SHARED["mse"] = (trainer, _copy(trainer.state))
    trainer, state = _SHARED["mse"]  # type: ignore[misc]
    trainer.state, trainer.stop_training = _copy(state), False
    return trainer


@functools.lru_cache(maxsize=1)
def scheduled_trainer() -> ef.Trainer:
    """A SmallMLP whose injected learning rate is an optax schedule (per step), shared by the
    modules showing that the LR callbacks refuse it."""
    schedule = optax.linear_schedule(0.1, 0.01, 10)
    optimizer = optax.inject_hyperparams(optax.sgd)(learning_rate=schedule)
    return ef.Trainer(SmallMLP(), optimizer=optimizer, seed=0, steps_per_execution=1)


class Recorder(Callback):
    """Records every hook it overrides as ``(hook, index or None, sorted log keys)``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def _add(self, hook: str, index, logs) -> None:
        self.calls.append((hook, index, sorted(logs)))


def _recording(hook: str, indexed: bool):
    if indexed:

        def method(self, index, logs=None):
            self._add(hook, index, logs)
    else:

        def method(self, logs=None):
            self._add(hook, None, logs)

    method.__name__ = hook
    return method


for _hook in (
    "on_train_begin",
    "on_train_end",
    "on_test_begin",
    "on_test_end",
    "on_predict_begin",
    "on_predict_end",
):
    setattr(Recorder, _hook, _recording(_hook, False))
for _hook in (
    "on_epoch_begin",
    "on_epoch_end",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_test_batch_begin",
    "on_test_batch_end",
    "on_predict_batch_begin",
    "on_predict_batch_end",
):
    setattr(Recorder, _hook, _recording(_hook, True))
