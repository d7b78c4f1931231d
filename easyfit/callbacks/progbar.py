"""ProgbarLogger: a tqdm bar per epoch (a live widget in Jupyter), or one line per epoch when
stdout is a file or a pipe."""

from __future__ import annotations

import sys
import time

from .callback import Callback, Logs

__all__ = ["ProgbarLogger", "display_mode", "in_notebook"]


def _fmt(logs: Logs) -> str:
    return " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (Jupyter, JupyterLab, VS Code, Colab): IPython
    is imported and its shell is a ``ZMQInteractiveShell`` (or a subclass). IPython is never
    imported here: a kernel has imported it already."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return any(c.__name__ == "ZMQInteractiveShell" for c in type(shell).__mro__[:-1])


def display_mode(verbose: int, isatty: bool, notebook: bool) -> str | None:
    """How ``ProgbarLogger`` shows progress: ``"bar"`` (tqdm.auto: a live widget in a
    notebook, a text bar on a terminal), ``"lines"`` (one line per epoch: ``verbose=2``, or
    stdout is a file or a pipe, as in a log), or None (``verbose=0``).

    Example:
        >>> from easyfit.callbacks.progbar import display_mode
        >>> display_mode(1, isatty=False, notebook=True), display_mode(1, False, False)
        ('bar', 'lines')
    """
    if not verbose:
        return None
    return "bar" if verbose == 1 and (isatty or notebook) else "lines"


class ProgbarLogger(Callback):
    """Shows progress: a tqdm bar with loss and metrics (refreshed at most every ``interval``
    seconds, the only moments it reads metrics from the device), as a live widget in Jupyter
    (``tqdm.auto``), or, when stdout is a file or a pipe or ``verbose=2``, one line per epoch
    (see ``display_mode``).

    Args:
        verbose: 1 for a bar (a line per epoch in a log file), 2 for a line per epoch.
        interval: seconds between refreshes of the metrics shown on the bar.
    """

    def __init__(self, verbose: int = 1, interval: float = 0.5):
        super().__init__()
        self.verbose = verbose
        self.interval = interval
        self._bar = None

    def _use_bar(self) -> bool:
        return display_mode(self.verbose, sys.stdout.isatty(), in_notebook()) == "bar"

    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        self._start = time.perf_counter()
        self._last = self._start
        self._epoch = epoch
        if self._use_bar():
            from tqdm.auto import tqdm

            steps = self.params.get("steps") or None
            self._bar = tqdm(
                total=steps,
                desc=f"Epoch {epoch + 1}/{self.params.get('epochs')}",
                unit="batch",
                file=sys.stdout,
                dynamic_ncols=True,
                leave=True,
            )

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        if self._bar is None:
            return
        self._bar.update(1)
        now = time.perf_counter()
        if logs is not None and now - self._last >= self.interval:
            self._last = now
            self._bar.set_postfix({k: f"{v:.4f}" for k, v in logs.items()}, refresh=False)

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        seconds = time.perf_counter() - self._start
        if self._bar is not None:
            self._bar.set_postfix({k: f"{v:.4f}" for k, v in (logs or {}).items()}, refresh=False)
            self._bar.close()
            self._bar = None
            return
        print(
            f"Epoch {epoch + 1}/{self.params.get('epochs')} - {seconds:.1f}s - {_fmt(logs or {})}", flush=True
        )

    def on_train_end(self, logs: Logs | None = None) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
