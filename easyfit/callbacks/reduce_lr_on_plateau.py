"""ReduceLROnPlateau: lower the learning rate when a metric has stopped improving."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.learning_rate import get_learning_rate, set_learning_rate
from ._monitor import MonitorCallback
from .callback import Logs
from .learning_rate_scheduler import apply_learning_rate

__all__ = ["ReduceLROnPlateau"]


class ReduceLROnPlateau(MonitorCallback):
    """Multiplies the learning rate by ``factor`` when ``monitor`` has not improved for
    ``patience`` epochs (Keras semantics).

    The optimizer must be built with ``optax.inject_hyperparams`` and a number as its rate (see
    ``LearningRateScheduler``); fit raises ValueError otherwise, and TypeError when the rate
    is an optax schedule (as Keras does for a ``LearningRateSchedule``).

    Args:
        monitor: the metric to watch.
        factor: the multiplier, below 1.
        patience: epochs without improvement before reducing. With a ``val_`` monitor, an
            epoch fit did not validate (``validation_freq``) does not count, for ``patience``
            or ``cooldown``.
        verbose: 1 prints a line at each reduction.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (as ``EarlyStopping``'s: a monitor of no
            known direction raises ValueError in auto mode; another value warns and means
            auto).
        min_delta: the smallest change that counts as an improvement.
        cooldown: epochs to wait after a reduction before counting again.
        min_lr: the learning rate never goes below this.

    Example:
        >>> from easyfit.callbacks import ReduceLROnPlateau
        >>> ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=2).mode
        'auto'
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        factor: float = 0.1,
        patience: int = 10,
        verbose: int = 0,
        mode: str = "auto",
        min_delta: float = 1e-4,
        cooldown: int = 0,
        min_lr: float = 0.0,
    ):
        if factor >= 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor={factor} must be below 1")
        super().__init__(monitor, mode, min_delta, "ReduceLROnPlateau")
        self.factor = float(factor)
        self.patience = int(patience)
        self.verbose = verbose
        self.cooldown = int(cooldown)
        self.min_delta = min_delta
        self.min_lr = float(min_lr)
        self.on_train_begin()

    def on_train_begin(self, logs: Logs | None = None) -> None:
        self.best: float | None = None
        self.wait = 0
        self.cooldown_counter = 0
        if self._trainer is not None and self._trainer.state is not None:
            set_learning_rate(self._trainer.state.opt_state, 0.0)  # raises if there is none

    def get_state(self) -> dict[str, Any]:
        """The best value and the counters (the learning rate is in the training state)."""
        return {"best": self.best, "wait": self.wait, "cooldown_counter": self.cooldown_counter}

    def set_state(self, state: dict[str, Any]) -> None:
        self.best, self.wait, self.cooldown_counter = state["best"], state["wait"], state["cooldown_counter"]

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        current = self._epoch_value(logs)
        if current is None:
            return
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if self._monitor.improved(current, self.best):
            self.best = current
            self.wait = 0
            return
        if self.cooldown_counter > 0:
            return
        self.wait += 1
        if self.wait < self.patience:
            return
        state = self.trainer.state
        assert state is not None
        old = get_learning_rate(state.opt_state)
        assert old is not None  # on_train_begin checked that there is one
        if old > np.float32(self.min_lr):
            new = max(old * self.factor, self.min_lr)
            apply_learning_rate(self.trainer, new)
            if self.verbose > 0:
                print(f"Epoch {epoch + 1}: ReduceLROnPlateau reducing learning rate to {new}.", flush=True)
            self.cooldown_counter = self.cooldown
            self.wait = 0
