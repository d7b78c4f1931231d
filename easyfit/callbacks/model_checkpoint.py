"""ModelCheckpoint: save the model (or its weights) every epoch or every N batches."""

from __future__ import annotations

import os
import shutil
import string
from collections.abc import Mapping
from typing import Any

import jax

from ..persistence.checkpoint_files import owned
from ._monitor import MonitorCallback
from .callback import Logs
from .periodic import Periodic

__all__ = ["ModelCheckpoint"]


class ModelCheckpoint(MonitorCallback):
    """Saves an Orbax checkpoint (``Trainer.save``) at some frequency, as Keras does.

    ``filepath`` names a checkpoint *directory* and may hold placeholders filled with
    ``str.format``: ``{epoch}`` (1-based, as in Keras), ``{batch}`` (1-based, with an integer
    ``save_freq``) and any key of the logs, e.g. ``"ckpt/{epoch:02d}-{val_loss:.3f}"``. Load
    one with ``trainer.load(path)`` or ``Trainer.from_checkpoint(path, model)``. A checkpoint
    already at the path is replaced only once the new one is complete; anything else there (a
    file, a directory that is not an easyfit checkpoint) stops fit with a CheckpointError and
    is left as it is.

    Args:
        filepath: the checkpoint directory, with optional placeholders.
        monitor: the metric compared when ``save_best_only``.
        verbose: 1 prints a line per save (and per non-improvement).
        save_best_only: save only when ``monitor`` improves on the best so far. When
            ``monitor`` is not in the logs (a typo, no validation data, or the batch logs of
            an integer ``save_freq``, which hold no ``val_*``) it warns and saves, as Keras;
            but an epoch fit did not validate on purpose (``validation_freq``) is neither
            saved nor compared, unlike Keras: the validated best is never overwritten.
        save_weights_only: save parameters and model state only, not the optimizer state.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (as ``EarlyStopping``'s: a monitor of no
            known direction raises ValueError in auto mode; another value warns and means
            auto).
        save_freq: ``"epoch"``, or an integer: every that many batches, counted across epochs
            (dispatches with ``steps_per_execution``; the logs are then the epoch's running
            metrics, read from the device only at those batches).
        initial_value_threshold: the value ``monitor`` must beat for the first save.
        max_to_keep: keep only this many of the checkpoints this callback wrote, the latest
            (with ``save_best_only``, the best); older ones it deletes once a newer one is
            complete. None (default) keeps all. Nothing it did not write is ever deleted.
        adapters_only: for a model with LoRA adapters (``trainable="lora:rank=N"``), save the
            adapters and the head alone (and their optimizer state), as
            ``Trainer.save(path, adapters_only=True)``: a folder of a few megabytes that
            ``trainer.load(path)`` puts back onto a model built from the same base weights.
            ValueError at the start of fit when the model has no LoRA layers. Not in Keras.

    Attributes:
        saved: the paths of the checkpoints it wrote, oldest first (a path written again is
            listed again); what ``WandbLogger`` and ``MLflowLogger`` log with
            ``log_checkpoints=``.

    Example:
        >>> from easyfit.callbacks import ModelCheckpoint
        >>> ModelCheckpoint("ckpt/{epoch:02d}-{val_accuracy:.3f}", monitor="val_accuracy",
        ...                 save_best_only=True).mode
        'auto'
    """

    def __init__(
        self,
        filepath: str | os.PathLike,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_best_only: bool = False,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        initial_value_threshold: float | None = None,
        max_to_keep: int | None = None,
        adapters_only: bool = False,
    ):
        if adapters_only and save_weights_only:
            raise ValueError(
                "ModelCheckpoint: give save_weights_only=True or adapters_only=True, not both "
                "(adapters_only saves less: the adapters and the head)"
            )
        self.adapters_only = bool(adapters_only)
        if max_to_keep is not None and (not isinstance(max_to_keep, int) or max_to_keep < 1):
            raise ValueError(f"max_to_keep={max_to_keep!r}: expected None or an integer >= 1")
        super().__init__(monitor, mode, 0.0, "ModelCheckpoint")
        self.max_to_keep = max_to_keep
        self._written: list[str] = []
        self.saved: list[str] = []
        self.filepath = os.fspath(filepath)
        self.verbose = verbose
        self.save_best_only = save_best_only
        self.save_weights_only = save_weights_only
        self._every = Periodic(save_freq, "save_freq")
        self.save_freq = self._every.every
        self.best = initial_value_threshold
        self._fields = {f for _, f, _, _ in string.Formatter().parse(self.filepath) if f}
        self._epoch = 0

    def _implements(self, hook: str) -> bool:
        if hook == "on_train_batch_end":  # only with a save_freq in batches
            return self._every.by_batch
        return super()._implements(hook)

    def get_state(self) -> dict[str, Any]:
        """The best value, the batch counter and the checkpoints written (``saved``, and those
        ``max_to_keep`` may delete)."""
        return {
            "best": self.best,
            "epoch": self._epoch,
            "since": self._every.count,
            "saved": list(self.saved),
            "written": list(self._written),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.best, self._epoch, self._every.count = state["best"], state["epoch"], state["since"]
        self.saved, self._written = list(state["saved"]), list(state["written"])

    def on_train_begin(self, logs: Logs | None = None) -> None:
        if not self.adapters_only:
            return
        from ..models.adapters import has_adapters  # flax.nnx: imported when it is used

        state = self.trainer.state
        if state is None or not has_adapters(state.params):
            raise ValueError(
                "ModelCheckpoint(adapters_only=True): the model has no LoRA adapters to save; "
                "add them (Trainer(model, optimizer=ef.models.trainable(model, tx, "
                "'lora:rank=N'))), or save the whole model (adapters_only=False)"
            )

    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        self._epoch = epoch

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        self._monitor.resolve(self._trainer)  # as Keras: an unknown direction raises here
        if self.save_freq == "epoch":
            self._save(epoch, None, logs)

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        if self._every.tick():
            self._save(self._epoch, batch, logs)

    def _path(self, epoch: int, batch: int | None, logs: Mapping[str, Any]) -> str:
        names: dict[str, Any] = {"epoch": epoch + 1}
        if batch is not None:
            names["batch"] = batch + 1
        if self._fields - names.keys():  # reading batch logs syncs with the device: only if used
            names = {**logs, **names}
        try:
            return self.filepath.format(**names)
        except KeyError as e:
            raise ValueError(
                f"ModelCheckpoint: filepath {self.filepath!r} names {e}, which is "
                f"neither epoch, batch nor a key of the logs "
                f"({', '.join(sorted(logs))})"
            ) from None

    def _save(self, epoch: int, batch: int | None, logs: Logs | None) -> None:
        logs = logs or {}
        what = "saving"
        if self.save_best_only and batch is None and self._monitor.unvalidated(self._callbacks, logs):
            if self.verbose > 0:  # validation_freq: this epoch's weights are not compared
                print(f"Epoch {epoch + 1}: not validated, {self.monitor} not compared", flush=True)
            return
        current = self._monitor.value(logs, "; saving the model") if self.save_best_only else None
        if current is not None:
            self._monitor.resolve(self._trainer)
            best = f"{self.best:.5f}" if self.best is not None else "None"
            if not self._monitor.improved(current, self.best):
                if self.verbose > 0:
                    print(f"Epoch {epoch + 1}: {self.monitor} did not improve from {best}", flush=True)
                return
            what = f"{self.monitor} improved from {best} to {current:.5f}, saving"
            self.best = current
        path = self._path(epoch, batch, logs)
        if self.verbose > 0:
            kind = "weights" if self.save_weights_only else "adapters" if self.adapters_only else "model"
            print(f"Epoch {epoch + 1}: {what} {kind} to {path}", flush=True)
        path = self.trainer.save(path, weights_only=self.save_weights_only, adapters_only=self.adapters_only)
        self.saved.append(path)
        self._forget_old(path)

    def _forget_old(self, path: str) -> None:
        """Deletes this callback's checkpoints beyond the newest ``max_to_keep``."""
        if self.max_to_keep is None:
            return
        if path in self._written:
            self._written.remove(path)
        self._written.append(path)
        while len(self._written) > self.max_to_keep:
            old = self._written.pop(0)
            if self.adapters_only:
                from ..models.adapters import owned as adapters_owned

                mine = adapters_owned(old)
            else:
                mine = owned(old)
            if jax.process_index() == 0 and mine:  # still the checkpoint it wrote
                shutil.rmtree(old)
