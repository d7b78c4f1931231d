"""CSVLogger: one CSV row per epoch."""

from __future__ import annotations

import csv
import os
from typing import IO

import jax

from .callback import Callback, Logs

__all__ = ["CSVLogger"]


class CSVLogger(Callback):
    """Writes ``epoch`` and every log value, one row per epoch (Keras semantics).

    Columns are ``epoch`` then the first epoch's log keys, sorted; a value missing later is
    written ``NA``. The file is flushed after every row. Only process 0 writes.

    Args:
        filename: the CSV file.
        separator: the field separator.
        append: add to an existing file (no second header) instead of overwriting it.

    Example:
        >>> import os
        >>> from easyfit.callbacks import CSVLogger
        >>> log = CSVLogger(os.path.join(DOCS_TMP, "log.csv"))
        >>> log.on_train_begin()
        >>> log.on_epoch_end(0, {"loss": 0.5, "accuracy": 0.75})
        >>> log.on_train_end()
        >>> print(open(log.filename).read().strip())
        epoch,accuracy,loss
        0,0.75,0.5
    """

    def __init__(self, filename: str | os.PathLike, separator: str = ",", append: bool = False):
        super().__init__()
        self.filename = os.fspath(filename)
        self.sep = separator
        self.append = append
        self._file: IO[str] | None = None
        self._writer: csv.DictWriter | None = None

    def on_train_begin(self, logs: Logs | None = None) -> None:
        if jax.process_index() != 0:
            return
        has_rows = self.append and os.path.isfile(self.filename) and os.path.getsize(self.filename) > 0
        folder = os.path.dirname(self.filename)
        if folder:
            os.makedirs(folder, exist_ok=True)
        self._file = open(self.filename, "a" if self.append else "w", newline="")
        self._writer = None
        self._header = not has_rows

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        if self._file is None:
            return
        logs = dict(logs or {})
        if self._writer is None:
            self._writer = csv.DictWriter(
                self._file,
                fieldnames=["epoch", *sorted(logs)],
                delimiter=self.sep,
                restval="NA",
                extrasaction="ignore",
            )
            if self._header:
                self._writer.writeheader()
        self._writer.writerow({"epoch": epoch, **logs})
        self._file.flush()

    def on_train_end(self, logs: Logs | None = None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            self._writer = None
