"""What the experiment trackers (WandbLogger, MLflowLogger) share: the run's configuration, the
epoch metrics, batch metrics at a chosen frequency (read from the device only then), and the
checkpoints of a ModelCheckpoint as artifacts."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ..core.learning_rate import get_learning_rate
from .callback import Callback, Logs
from .model_checkpoint import ModelCheckpoint
from .periodic import Periodic

__all__ = ["Tracker", "import_extra", "run_config"]


def import_extra(module: str, extra: str, owner: str) -> Any:
    """``import module``, or ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f'{owner} needs {module}: pip install "easyfit-flax[{extra}]"') from e


def run_config(trainer: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """What a fit is configured with, as a tracker records it: the optimizer (its Keras name,
    or its state's layout), batch size, epochs, steps, precision, seed, devices, input shape
    and the training data's input recipe (``easyfit.data.recipe``)."""
    meta = trainer.checkpoint_meta
    optimizer = meta.get("optimizer") or {}
    plan = trainer.progress.plan if trainer.progress is not None else None
    config: dict[str, Any] = {
        "optimizer": optimizer.get("name") or optimizer.get("state"),
        "batch_size": params.get("batch_size"),
        "epochs": params.get("epochs"),
        "precision": meta.get("precision"),
        "seed": meta.get("seed"),
        "input_shape": meta.get("input_shape"),
        "recipe": meta.get("recipe"),
    }
    if plan is not None:
        config.update(
            train_samples=plan.num_samples,
            shuffle=plan.shuffle,
            steps_per_epoch=plan.steps_per_epoch,
            steps_per_execution=plan.steps_per_execution,
            devices=plan.num_shards,
        )
    return config


def _numbers(prefix: str, logs: Mapping[str, Any]) -> dict[str, float]:
    """The numeric values of ``logs``, keys prefixed (a callback may add other values: left out)."""
    out = {}
    for key, value in logs.items():
        try:
            out[prefix + key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


class Tracker(Callback):
    """Base of the experiment trackers. A subclass writes to its service in ``_open``,
    ``_log``, ``_log_checkpoint`` and ``_close``; only process 0 calls them.

    Metrics are named ``epoch/<key>`` (each epoch's logs: metrics, ``val_*``, ``input_wait``,
    ``learning_rate``, ``loss_scale``; ``epoch/epoch`` the 0-based epoch) and, with an integer
    ``update_freq``, ``batch/<key>`` (the epoch's running metrics, the learning rate, and
    ``batch/step``, the optimizer step) every that many batches (dispatches).
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None,
        update_freq: str | int,
        log_checkpoints: ModelCheckpoint | None,
    ):
        super().__init__()
        name = type(self).__name__
        self.config = dict(config or {})
        self._every = Periodic(update_freq, "update_freq")
        self.update_freq = self._every.every
        if log_checkpoints is not None and not isinstance(log_checkpoints, ModelCheckpoint):
            raise TypeError(
                f"{name}: log_checkpoints={log_checkpoints!r}: expected None or the ModelCheckpoint "
                "of the same fit (its checkpoints are logged as artifacts)"
            )
        self.log_checkpoints = log_checkpoints
        self._logged = 0  # checkpoints of log_checkpoints.saved logged already
        self._open_run = False
        self._interrupted = False

    def _implements(self, hook: str) -> bool:
        if hook == "on_train_batch_end":  # only with an update_freq in batches
            return self._every.by_batch
        return super()._implements(hook)

    # -------------------------------------------------------------------- what a subclass writes
    def _open(self, config: dict[str, Any]) -> None:
        raise NotImplementedError

    def _log(self, metrics: dict[str, float], step: int, epoch: int | None) -> None:
        """``metrics`` at optimizer step ``step``; ``epoch`` for the epoch's metrics."""
        raise NotImplementedError

    def _log_checkpoint(self, path: str) -> None:
        raise NotImplementedError

    def _close(self, status: str) -> None:
        """``status``: ``"finished"``, ``"interrupted"`` or ``"failed"``."""
        raise NotImplementedError

    # ----------------------------------------------------------------------------------- hooks
    def on_train_begin(self, logs: Logs | None = None) -> None:
        self._every.count = 0
        self._interrupted = False
        self._logged = len(self.log_checkpoints.saved) if self.log_checkpoints is not None else 0
        if jax.process_index() != 0:
            return
        self._open({**run_config(self.trainer, self.params), **self.config})
        self._open_run = True

    def get_state(self) -> dict[str, Any]:
        """The batch counter (``update_freq``) and the checkpoints logged already."""
        return {"since": self._every.count, "logged": self._logged}

    def set_state(self, state: dict[str, Any]) -> None:
        self._every.count, self._logged = state["since"], state["logged"]

    def _step(self) -> int:
        state = self.trainer.state
        assert state is not None  # set before the first batch
        return int(np.asarray(state.step))

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        if not self._every.tick():
            return
        # reading the logs (the one host sync) runs a jitted call: on every process, as all
        # run the steps, though only process 0 logs
        metrics = _numbers("batch/", logs or {})
        if not self._open_run:
            return
        state = self.trainer.state
        assert state is not None
        rate = get_learning_rate(state.opt_state)
        if rate is not None:
            metrics["batch/learning_rate"] = rate
        step = self._step()
        metrics["batch/step"] = step
        self._log(metrics, step, None)
        self._checkpoints()

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        if not self._open_run:
            return
        metrics = _numbers("epoch/", logs or {})
        metrics["epoch/epoch"] = epoch
        self._log(metrics, self._step(), epoch)
        self._checkpoints()

    def _checkpoints(self) -> None:
        """Logs the checkpoints the ModelCheckpoint wrote since the last call."""
        if self.log_checkpoints is None:
            return
        saved = self.log_checkpoints.saved
        for path in saved[self._logged :]:
            self._log_checkpoint(path)
        self._logged = len(saved)

    def on_interrupt(self, logs: Logs | None = None) -> None:
        self._interrupted = True

    def on_train_end(self, logs: Logs | None = None) -> None:
        if not self._open_run:
            return
        self._open_run = False
        failed = sys.exc_info()[0] is not None
        try:
            self._checkpoints()  # those written after the last epoch's end hook
        finally:
            self._close("interrupted" if self._interrupted else "failed" if failed else "finished")
