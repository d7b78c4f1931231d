"""CSVLogger: one CSV row per epoch."""

from __future__ import annotations

import csv
import os
import warnings
from collections.abc import Mapping
from typing import IO, Any

import jax

from .callback import Callback, Logs

__all__ = ["CSVLogger"]

#: Keys of the training logs that validation never has (no ``val_`` column is made for them).
_TRAINING_ONLY = ("input_wait", "learning_rate", "loss_scale")


class CSVLogger(Callback):
    """Writes ``epoch`` and every log value, one row per epoch (Keras semantics).

    Columns are ``epoch``, then the first epoch's log keys, sorted, and, as in Keras, when
    that epoch was not validated, a ``val_`` column for each of them (``validation_freq``, no
    validation data; none for ``input_wait``, ``learning_rate`` and ``loss_scale``, which
    validation never logs): a value missing from a row is written ``NA``. A key first logged at a
    later epoch (a callback adds it) gets a column too: the file is rewritten with it, the
    earlier rows ``NA``; when appending to a file of earlier runs, whose header stays, such a
    key is left out with a warning. The file is flushed after every row. Only process 0
    writes.

    Args:
        filename: the CSV file.
        separator: the field separator.
        append: add to an existing file (under its header, not a second one) instead of
            overwriting it.

    Example:
        >>> import os, tempfile
        >>> tmp = tempfile.mkdtemp()
        >>> from easyfit.callbacks import CSVLogger
        >>> log = CSVLogger(os.path.join(tmp, "log.csv"))
        >>> log.on_train_begin()
        >>> log.on_epoch_end(0, {"loss": 0.5, "accuracy": 0.75})
        >>> log.on_train_end()
        >>> print(open(log.filename).read().strip())
        epoch,accuracy,loss,val_accuracy,val_loss
        0,0.75,0.5,NA,NA
    """

    def __init__(self, filename: str | os.PathLike, separator: str = ",", append: bool = False):
        super().__init__()
        self.filename = os.fspath(filename)
        self.sep = separator
        self.append = append
        self.keys: list[str] | None = None
        self._file: IO[str] | None = None
        self._rows: list[dict[str, Any]] = []  # this run's rows, to rewrite with a new column
        self._fixed = False  # the header is an earlier run's: it stays

    def on_train_begin(self, logs: Logs | None = None) -> None:
        if jax.process_index() != 0:
            return
        self.on_train_end()  # a reused logger: close what a failed run left open
        self.keys, self._rows, self._fixed = None, [], False
        if self.append and os.path.isfile(self.filename) and os.path.getsize(self.filename) > 0:
            with open(self.filename, newline="") as f:
                header = next(csv.reader(f, delimiter=self.sep), [])
            self.keys, self._fixed = [k for k in header if k != "epoch"], True
        folder = os.path.dirname(self.filename)
        if folder:
            os.makedirs(folder, exist_ok=True)
        self._file = open(self.filename, "a" if self.append else "w", newline="")
        self._start = self._file.tell()  # where this run's header (or first row) goes

    def _columns(self, logs: Mapping[str, Any]) -> list[str]:
        keys = sorted(logs)
        if not any(k.startswith("val_") for k in keys):  # not validated: its columns, as Keras
            keys += [f"val_{k}" for k in keys if k not in _TRAINING_ONLY]
        return keys

    def _write(self, rows: list[dict[str, Any]], header: bool) -> None:
        assert self._file is not None and self.keys is not None
        writer = csv.DictWriter(
            self._file, ["epoch", *self.keys], delimiter=self.sep, restval="NA", extrasaction="ignore"
        )
        if header:
            writer.writeheader()
        writer.writerows(rows)
        self._file.flush()

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        if self._file is None:
            return
        row = {"epoch": epoch, **(logs or {})}
        self._rows.append(row)
        if self.keys is None:
            self.keys = self._columns(logs or {})
            self._write([row], header=True)
            return
        new = sorted(k for k in logs or {} if k not in self.keys)
        if new and self._fixed:
            warnings.warn(
                f"CSVLogger: {', '.join(new)} not written to {self.filename}: the file's header "
                "(from an earlier run) has no such column",
                UserWarning,
                stacklevel=2,
            )
        elif new:  # widen this run's file: rewrite it with the new columns
            self.keys = sorted(self.keys + new)
            self._file.seek(self._start)
            self._file.truncate()
            self._write(self._rows, header=True)
            return
        self._write([row], header=False)

    def on_train_end(self, logs: Logs | None = None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
