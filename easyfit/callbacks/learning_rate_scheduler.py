"""LearningRateScheduler: set the learning rate at the start of each epoch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.learning_rate import get_learning_rate, set_learning_rate
from .callback import Callback, Logs

__all__ = ["LearningRateScheduler", "apply_learning_rate"]


def apply_learning_rate(trainer: Any, value: float) -> None:
    """Puts ``value`` into the trainer's optimizer state (see ``easyfit.core.learning_rate``)."""
    state = trainer.state
    trainer.state = state.replace(opt_state=set_learning_rate(state.opt_state, value))


class LearningRateScheduler(Callback):
    """Sets the learning rate to ``schedule(epoch, lr)`` before each epoch (Keras semantics).

    The optimizer must hold its learning rate in its state: build it with
    ``optax.inject_hyperparams``, e.g. ``optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)``
    (fit raises ValueError otherwise). The learning rate then appears in the epoch logs as
    ``learning_rate``. For a per-step schedule, give optax the schedule itself instead, without
    this callback: with a schedule as the injected rate, fit raises TypeError (the schedule
    would overwrite the rate at the next step; Keras raises too). A fit resumed from a backup
    in the middle of an epoch calls ``schedule`` for that epoch again with the rate the epoch
    began with, and keeps the backup's rate: the epoch's rate is set once, as in a fit never
    stopped.

    Args:
        schedule: ``(epoch, lr) -> new lr`` (``epoch`` from 0), or ``(epoch) -> new lr``; the
            new rate must be a float (Python's or NumPy's), as in Keras.
        verbose: 1 prints the learning rate set at each epoch.

    Example:
        >>> from easyfit.callbacks import LearningRateScheduler
        >>> halve = LearningRateScheduler(lambda epoch, lr: lr if epoch < 2 else lr / 2)
    """

    def __init__(self, schedule: Callable[..., float], verbose: int = 0):
        super().__init__()
        self.schedule = schedule
        self.verbose = verbose

    def on_train_begin(self, logs: Logs | None = None) -> None:
        state = self.trainer.state
        assert state is not None  # fit builds it before on_train_begin
        set_learning_rate(state.opt_state, 0.0)  # raises if there is none to set

    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        state = self.trainer.state
        assert state is not None
        current = get_learning_rate(state.opt_state)
        try:
            value = self.schedule(epoch, current)
        except TypeError:  # a schedule of the epoch alone, as Keras accepts
            value = self.schedule(epoch)
        if not isinstance(value, (float, np.floating)):
            raise ValueError(
                f"LearningRateScheduler: the output of the schedule should be a float, got {value!r}"
            )
        apply_learning_rate(self.trainer, float(value))
        if self.verbose > 0:
            print(
                f"Epoch {epoch + 1}: LearningRateScheduler setting learning rate to {float(value)}.",
                flush=True,
            )
