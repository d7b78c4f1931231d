"""EarlyStopping: stop when a monitored metric has stopped improving."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._monitor import MonitorCallback
from .callback import Logs

__all__ = ["EarlyStopping"]


class EarlyStopping(MonitorCallback):
    """Stops training when ``monitor`` has not improved for ``patience`` epochs (Keras
    semantics).

    Args:
        monitor: the metric to watch (``"val_loss"``, ``"val_accuracy"``, ``"loss"``, ...).
        min_delta: the smallest change that counts as an improvement.
        patience: epochs without improvement after which training stops.
        verbose: 1 prints a line when stopping and when restoring weights.
        mode: ``"min"``, ``"max"`` or ``"auto"``: ``loss`` is minimised, a metric goes the way
            it declares (easyfit's named metrics do), anything else raises ValueError at the
            first epoch's end, as in Keras. Another value warns and means ``"auto"``. A monitor
            missing from the logs warns and changes nothing; an epoch fit did not validate
            (``validation_freq``) does not count for a ``val_`` monitor: ``patience`` counts
            validated epochs.
        baseline: a value the metric must beat; until then ``patience`` keeps counting.
        restore_best_weights: at the end of training, put back the parameters (and model state)
            of the best epoch (their moving average too, under ``ema_momentum``). The copies
            stay on the device.
        start_from_epoch: epochs to wait before watching (warm-up).

    Attributes:
        stopped_epoch: the epoch at which training stopped (0 if it did not stop early).
        best: the best value seen (None before the first); ``best_epoch`` its epoch.
        monitor_op: ``np.greater`` or ``np.less`` once the direction is settled, as Keras'.

    Example:
        No fall of the loss is as large as ``min_delta`` here, so every epoch after the first
        counts as one without improvement, and training stops after ``patience`` of them:

        >>> import numpy as np, optax, easyfit as ef
        >>> from flax import linen as nn
        >>> from easyfit.callbacks import EarlyStopping
        >>> x, y = np.linspace(-1, 1, 256, dtype=np.float32).reshape(64, 4), np.arange(64) % 2
        >>> stop = EarlyStopping(monitor="loss", min_delta=10.0, patience=2)
        >>> trainer = ef.Trainer(nn.Dense(2), optimizer=optax.sgd(0.1), seed=0)
        >>> history = trainer.fit(x, y, epochs=10, batch_size=32, callbacks=[stop], verbose=0)
        >>> history.epoch, stop.stopped_epoch, stop.best == history.history["loss"][0]
        ([0, 1, 2], 2, True)
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        min_delta: float = 0.0,
        patience: int = 0,
        verbose: int = 0,
        mode: str = "auto",
        baseline: float | None = None,
        restore_best_weights: bool = False,
        start_from_epoch: int = 0,
    ):
        super().__init__(monitor, mode, min_delta, "EarlyStopping")
        self.patience = int(patience)
        self.verbose = verbose
        self.baseline = baseline
        self.restore_best_weights = restore_best_weights
        self.start_from_epoch = int(start_from_epoch)
        self.on_train_begin()

    def on_train_begin(self, logs: Logs | None = None) -> None:
        self.wait = 0
        self.stopped_epoch = 0
        self.best_epoch = 0
        self.best: float | None = None
        self.best_weights: Any = None

    def get_state(self) -> dict[str, Any]:
        """The counters and the best value (the best weights go into a backup as arrays)."""
        return {
            "wait": self.wait,
            "stopped_epoch": self.stopped_epoch,
            "best_epoch": self.best_epoch,
            "best": self.best,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.wait, self.stopped_epoch = state["wait"], state["stopped_epoch"]
        self.best_epoch, self.best = state["best_epoch"], state["best"]

    def _state_arrays(self) -> Any:
        """The best weights, for a backup (None when not kept)."""
        if self.best_weights is None:
            return None
        params, ema_params, model_state = self.best_weights
        return {"params": params, "ema_params": ema_params, "model_state": model_state}

    def _state_arrays_like(self) -> Any:
        state = self.trainer.state
        assert state is not None
        return {"params": state.params, "ema_params": state.ema_params, "model_state": state.model_state}

    def _set_state_arrays(self, tree: Any) -> None:
        self.best_weights = (tree["params"], tree["ema_params"], tree["model_state"])

    def _weights(self) -> Any:
        state = self.trainer.state
        assert state is not None
        return jax.tree_util.tree_map(jnp.copy, (state.params, state.ema_params, state.model_state))

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        current = self._epoch_value(logs)
        if current is None or epoch < self.start_from_epoch:
            return
        if self.restore_best_weights and self.best_weights is None:
            self.best_weights = self._weights()
            self.best_epoch = epoch
        self.wait += 1
        if self._monitor.improved(current, self.best):
            self.best = current
            self.best_epoch = epoch
            if self.restore_best_weights:
                self.best_weights = self._weights()
            if self.baseline is None or self._monitor.improved(current, self.baseline):
                self.wait = 0
            return
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.trainer.stop_training = True

    def on_train_end(self, logs: Logs | None = None) -> None:
        if self.stopped_epoch > 0 and self.verbose > 0:
            print(f"Epoch {self.stopped_epoch + 1}: early stopping", flush=True)
        if self.restore_best_weights and self.best_weights is not None:
            if self.verbose > 0:
                print(
                    f"Restoring model weights from the end of the best epoch: {self.best_epoch + 1}.",
                    flush=True,
                )
            params, ema_params, model_state = self.best_weights
            state = self.trainer.state
            assert state is not None
            self.trainer.state = state.replace(params=params, ema_params=ema_params, model_state=model_state)
            self.best_weights = None
