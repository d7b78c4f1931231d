"""ProgbarLogger: a tqdm bar per epoch (a live widget in Jupyter) ending in every metric of the
epoch, or one line per epoch when stdout is a file or a pipe."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import time
from typing import Any

from .callback import Callback, Logs

__all__ = ["ProgbarLogger", "display_mode", "format_value", "in_notebook", "metric_lines"]

_SEP = " - "
_MIN_BAR = 12  # the bar's width kept while metrics ride along on its line


def format_value(value: float) -> str:
    """``value`` as Keras' progress bar writes it: four decimals, or four significant digits
    in scientific notation at or below 1e-3 (a learning rate of 2.5e-4 reads ``2.5000e-04``,
    not ``0.0003``).

    Example:
        >>> from easyfit.callbacks.progbar import format_value
        >>> format_value(0.25), format_value(2.5e-4), format_value(0.0)
        ('0.2500', '2.5000e-04', '0.0000e+00')
    """
    return f"{value:.4f}" if abs(value) > 1e-3 else f"{value:.4e}"


def _fmt(logs: Logs) -> str:
    return _SEP.join(_fields(logs))


def _fields(logs: Logs) -> list[str]:
    return [f"{k}: {format_value(v)}" for k, v in logs.items()]


def metric_lines(logs: Logs, width: int | None, indent: str = "  ") -> list[str]:
    """Every ``name: value`` of ``logs``, joined by `` - `` into lines of at most ``width``
    characters (a field is never split; None: one line), each line after ``indent``.

    Example:
        >>> from easyfit.callbacks.progbar import metric_lines
        >>> logs = {"loss": 0.5, "accuracy": 0.75, "val_loss": 0.625}
        >>> metric_lines(logs, 40)
        ['  loss: 0.5000 - accuracy: 0.7500', '  val_loss: 0.6250']
        >>> metric_lines(logs, None)
        ['  loss: 0.5000 - accuracy: 0.7500 - val_loss: 0.6250']
    """
    lines: list[str] = []
    for field in _fields(logs):
        if lines and (width is None or len(lines[-1]) + len(_SEP) + len(field) <= width):
            lines[-1] += _SEP + field
        else:
            lines.append(indent + field)
    return lines


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (Jupyter, JupyterLab, VS Code, Colab): IPython
    is imported and its shell is a ``ZMQInteractiveShell`` (or a subclass). IPython is never
    imported here: a kernel has imported it already."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return any(c.__name__ == "ZMQInteractiveShell" for c in type(shell).__mro__[:-1])


def display_mode(verbose: int, isatty: bool, notebook: bool) -> str | None:
    """How ``ProgbarLogger`` shows progress: ``"bar"`` (a text bar on a terminal, a live
    widget in a notebook with ipywidgets, a text bar in one without), ``"lines"`` (one line
    per epoch: ``verbose=2``, or stdout is a file or a pipe, as in a log), or None
    (``verbose=0``).

    Example:
        >>> from easyfit.callbacks.progbar import display_mode
        >>> display_mode(1, isatty=False, notebook=True), display_mode(1, False, False)
        ('bar', 'lines')
    """
    if not verbose:
        return None
    return "bar" if verbose == 1 and (isatty or notebook) else "lines"


def _bar_class(notebook: bool) -> Any:
    """tqdm's widget in a notebook that has ipywidgets, its text bar elsewhere (tqdm.auto
    would warn in a notebook without ipywidgets and then draw the text bar anyway)."""
    if notebook and importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.notebook import tqdm as widget

        return widget
    from tqdm.std import tqdm

    return tqdm


class ProgbarLogger(Callback):
    """Shows progress: a bar per epoch, and at the epoch's end every metric (``val_*`` too).

    On a terminal the bar carries as many metrics as fit beside a bar of sensible width
    (refreshed at most every ``interval`` seconds, the only moments it reads metrics from the
    device); when the epoch ends, the lines under it hold every metric, wrapped to the
    terminal's width. In Jupyter the bar is a live widget (with ipywidgets; a text bar
    without), followed by one line per epoch that names it (``Epoch 1/5 - 2.1s - loss: ...``):
    where widgets are not rendered (a notebook saved and read elsewhere) a widget shows as its
    text, the bar as it ended. When stdout is a file or a pipe, or with ``verbose=2``, one line per epoch (see
    ``display_mode``).

    Args:
        verbose: 1 for a bar (a line per epoch in a log file), 2 for a line per epoch.
        interval: seconds between refreshes of the metrics shown on the bar.
    """

    def __init__(self, verbose: int = 1, interval: float = 0.5):
        super().__init__()
        self.verbose = verbose
        self.interval = interval
        self._bar: Any = None
        self._barred = False  # this epoch shows a bar (closed once full, or at its end)
        self._notebook = False
        self._shown: Any = None  # the display of the notebook widget

    def _width(self) -> int | None:
        """The terminal's width (None in a notebook: its output area wraps lines itself)."""
        return None if self._notebook else shutil.get_terminal_size().columns

    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        self._start = time.perf_counter()
        self._last = self._start
        self._epoch = epoch
        self._notebook = in_notebook()
        self._barred = display_mode(self.verbose, sys.stdout.isatty(), self._notebook) == "bar"
        if self._barred:
            steps = self.params.get("steps") or None
            bar = _bar_class(self._notebook)
            widget = bar.__module__ == "tqdm.notebook"
            self._bar = bar(
                total=steps,
                desc=f"Epoch {epoch + 1}/{self.params.get('epochs')}",
                unit="batch",
                file=sys.stdout,
                dynamic_ncols=True,
                leave=True,
                **({"display": False} if widget else {}),
            )
            if widget:  # shown here, to show it again as it ends (see _close)
                from IPython.display import display

                self._shown = display(self._bar.container, display_id=True)

    def _postfix(self, logs: Logs) -> dict[str, str]:
        """The metrics that fit on the bar's line beside a bar of at least ``_MIN_BAR``."""
        width = self._width()
        digits = len(str(self._bar.total or 0))
        # "Epoch 1/5: 100%|" and "| 30/30 [00:08<00:00, 3.49batch/s]" beside the bar
        overhead = len(self._bar.desc) + 2 * digits + 36
        room = None if width is None else width - overhead - _MIN_BAR
        postfix: dict[str, str] = {}
        used = 0
        for k, v in logs.items():
            shown = format_value(v)
            used += len(k) + len(shown) + 3  # ", k=0.1234"
            if room is not None and used > room:
                break
            postfix[k] = shown
        return postfix

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        if self._bar is None:
            return
        self._bar.update(1)
        if self._bar.total is not None and self._bar.n >= self._bar.total:
            self._close()  # full: what prints before the epoch's end (validation) goes under it
            return
        now = time.perf_counter()
        if logs is not None and now - self._last >= self.interval:
            self._last = now
            self._bar.set_postfix(self._postfix(logs), refresh=False)

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix({}, refresh=False)  # every metric follows, under the bar
            self._bar.close()
            if self._shown is not None:
                # A widget's output keeps, for where widgets are not rendered (a saved notebook
                # on GitHub, nbconvert), the text of the bar when it was shown: at 0 %. Shown
                # again, that text is the bar as it ended.
                self._shown.update(self._bar.container)
                self._shown = None
            self._bar = None

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        seconds = time.perf_counter() - self._start
        if self._barred and not self._notebook:
            self._close()
            width = self._width()
            lines = metric_lines(logs or {}, None if width is None else width - 1)
            if lines:
                print("\n".join(lines), flush=True)
            return
        self._close()  # a notebook's line names its epoch: a widget may not show in a saved one
        print(
            f"Epoch {epoch + 1}/{self.params.get('epochs')} - {seconds:.1f}s - {_fmt(logs or {})}", flush=True
        )

    def on_train_end(self, logs: Logs | None = None) -> None:
        self._close()
