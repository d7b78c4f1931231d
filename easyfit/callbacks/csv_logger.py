"""CSVLogger: one CSV row per epoch."""

from __future__ import annotations

import csv
import io
import os
import warnings
from collections.abc import Mapping
from typing import Any

import jax

from .._files import check_writable, write_files
from .callback import Callback, Logs

__all__ = ["CSVLogger"]

#: Keys of the training logs that validation never has (no ``val_`` column is made for them).
_TRAINING_ONLY = ("input_wait", "learning_rate", "loss_scale")


def _plain(value: Any) -> Any:
    """``value`` as JSON holds it and the CSV file shows it: Python's numbers, strings,
    booleans and None as they are, anything else (a NumPy number) as the text written."""
    return value if value is None or type(value) in (bool, int, float, str) else str(value)


class CSVLogger(Callback):
    """Writes ``epoch`` and every log value, one row per epoch (Keras semantics).

    Columns are ``epoch``, then the first epoch's log keys, sorted, and, as in Keras, when
    that epoch was not validated, a ``val_`` column for each of them (``validation_freq``, no
    validation data; none for ``input_wait``, ``learning_rate`` and ``loss_scale``, which
    validation never logs): a value missing from a row is written ``NA``. A key first logged at a
    later epoch (a callback adds it) gets a column too: the file is rewritten with it, the
    earlier rows ``NA``; when appending to a file of earlier runs, whose header stays, such a
    key is left out with a warning. Only process 0 writes.

    The file is written whole after every row, to a staging name then renamed over it (the
    previous run's file, without ``append``, is replaced when the first epoch ends): a write
    that fails (a full disk) leaves the file as it was, never truncated, earlier runs' rows
    included.

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
        self._writing = False
        self._before = b""  # what the file held when an appending run began: kept as it was
        self._rows: list[dict[str, Any]] = []  # this run's rows, written after _before
        self._fixed = False  # the header is an earlier run's: it stays

    def on_train_begin(self, logs: Logs | None = None) -> None:
        if jax.process_index() != 0:
            return
        self.keys, self._rows, self._fixed, self._before = None, [], False, b""
        if self.append and os.path.isfile(self.filename) and os.path.getsize(self.filename) > 0:
            with open(self.filename, "rb") as f:
                self._before = f.read()
            with open(self.filename, newline="") as f:
                header = next(csv.reader(f, delimiter=self.sep), [])
            self.keys, self._fixed = [k for k in header if k != "epoch"], True
        folder = os.path.dirname(self.filename)
        if folder:
            os.makedirs(folder, exist_ok=True)
        check_writable(self.filename)  # now, not after the first epoch's training
        self._writing = True

    def get_state(self) -> dict[str, Any]:
        """This run's columns and rows (values as the file holds them) and where in the file
        the run began: a resumed fit writes the file as the run never stopped would."""
        return {
            "keys": self.keys,
            "rows": [{k: _plain(v) for k, v in row.items()} for row in self._rows],
            "fixed": self._fixed,
            "start": len(self._before),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Takes the run's rows back and writes the file from where the run began (the rows of
        epochs after the backup, which the resumed fit trains again, go)."""
        self.keys, self._rows, self._fixed = state["keys"], list(state["rows"]), state["fixed"]
        if not self._writing:  # not process 0
            return
        start = int(state["start"])
        if len(self._before) < start:  # the earlier part of the file is gone: a fresh header
            self._before, self._fixed = b"", False
        else:
            self._before = self._before[:start]
        if self.keys is not None and self._rows:
            self._write()

    def _columns(self, logs: Mapping[str, Any]) -> list[str]:
        keys = sorted(logs)
        if not any(k.startswith("val_") for k in keys):  # not validated: its columns, as Keras
            keys += [f"val_{k}" for k in keys if k not in _TRAINING_ONLY]
        return keys

    def _write(self) -> None:
        """Writes the file whole (staged, then renamed over it): what it held before this run
        (appending), the header unless that is an earlier run's, and this run's rows."""
        assert self.keys is not None
        text = io.StringIO()
        writer = csv.DictWriter(
            text, ["epoch", *self.keys], delimiter=self.sep, restval="NA", extrasaction="ignore"
        )
        if not self._fixed:
            writer.writeheader()
        writer.writerows(self._rows)
        write_files({self.filename: self._before + text.getvalue().encode()})

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        if not self._writing:
            return
        self._rows.append({"epoch": epoch, **(logs or {})})
        if self.keys is None:
            self.keys = self._columns(logs or {})
        new = sorted(k for k in logs or {} if k not in self.keys)
        if new and self._fixed:
            warnings.warn(
                f"CSVLogger: {', '.join(new)} not written to {self.filename}: the file's header "
                "(from an earlier run) has no such column",
                UserWarning,
                stacklevel=2,
            )
        elif new:  # widen this run's columns: the file is rewritten with them
            self.keys = sorted(self.keys + new)
        self._write()

    def on_train_end(self, logs: Logs | None = None) -> None:
        self._writing = False
