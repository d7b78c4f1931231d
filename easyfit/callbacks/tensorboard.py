"""TensorBoard: scalars in event files that TensorBoard reads, without TensorFlow."""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from ._monitor import check_freq
from .callback import Callback, Logs

__all__ = ["TensorBoard"]


class TensorBoard(Callback):
    """Writes the logs as TensorBoard scalars, laid out as Keras does: ``log_dir/train`` and
    ``log_dir/validation`` (``val_`` keys, prefix dropped), tags ``epoch_<metric>`` at each
    epoch's end (step = epoch) and, with an integer ``update_freq``, ``batch_<metric>`` every
    that many batches (step = the optimizer step; the running metrics of the epoch).

    Event files are written by ``tensorboardX`` (``pip install "easyfit[tensorboard]"``), which
    needs neither TensorFlow nor TensorBoard. Only process 0 writes. Histograms, graphs and
    profiling, which Keras' TensorBoard also offers, are not written.

    Args:
        log_dir: the run's directory (``tensorboard --logdir`` it, or a parent).
        update_freq: ``"epoch"``, or write batch-level scalars every that many batches (each
            time reading the metrics from the device).

    Example:
        >>> from easyfit.callbacks import TensorBoard
        >>> board = TensorBoard(DOCS_TMP + "/logs", update_freq=50)
    """

    def __init__(self, log_dir: str | os.PathLike = "logs", update_freq: str | int = "epoch"):
        super().__init__()
        self.log_dir = os.fspath(log_dir)
        self.update_freq = check_freq(update_freq, "update_freq")
        self._writers: dict[str, Any] = {}
        self._since = 0
        if self.update_freq != "epoch":
            # on purpose, per instance: CallbackList calls the batch hook only when it is set
            self.on_train_batch_end = self._on_batch_end  # type: ignore[method-assign]

    def _writer(self, split: str) -> Any:
        if split not in self._writers:
            try:
                from tensorboardX import SummaryWriter
            except ImportError as e:
                raise ImportError('TensorBoard needs tensorboardX: pip install "easyfit[tensorboard]"') from e
            self._writers[split] = SummaryWriter(os.path.join(self.log_dir, split))
        return self._writers[split]

    def _write(self, prefix: str, logs: Logs, step: int) -> None:
        if jax.process_index() != 0:
            return
        for key, value in logs.items():
            split, name = ("validation", key[4:]) if key.startswith("val_") else ("train", key)
            self._writer(split).add_scalar(f"{prefix}_{name}", float(value), global_step=step)

    def on_train_begin(self, logs: Logs | None = None) -> None:
        self._since = 0

    def _on_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        self._since += 1
        if self._since >= self.update_freq:
            self._since = 0
            state = self.trainer.state
            assert state is not None  # set before the first batch
            self._write("batch", logs or {}, int(np.asarray(state.step)))

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        self._write("epoch", logs or {}, epoch)
        for writer in self._writers.values():
            writer.flush()

    def on_train_end(self, logs: Logs | None = None) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers = {}
