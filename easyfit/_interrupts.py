"""What must not be cut short by Ctrl-C: joining background threads, closing pipelines, writing
a checkpoint.

A KeyboardInterrupt raised inside ``Thread.join`` (Python 3.10 to 3.12 at least) marks the thread as
ended although it runs on: the interpreter then exits without waiting for it, and a compilation
or a DALI pipeline still running while the runtime is torn down aborts the process
(``terminate called ...``, SIGABRT) or crashes it. So easyfit's background work runs in a
:class:`Background`, whose ``join`` waits on an event of its own (a Ctrl-C leaves the thread's
bookkeeping intact), and what must end whole runs :class:`shielded`: SIGINT and SIGTERM held,
and delivered once it has ended.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from .errors import Preempted

__all__ = ["DEFERS", "Background", "shielded"]

#: The attribute that marks a handler of ``easyfit.training.interrupt.deferred_signals``: a
#: shield may hold signals for it (a handler the user installed is left alone).
DEFERS = "easyfit_defers"

_DEFAULTS: dict[int, Any] = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


class Background:
    """A thread for work in the background (a compilation, a data loader), joined safely.

    Args:
        target: the work.
        name: the thread's name.
        daemon: whether the interpreter may exit without it (a loader, always closed first);
            not for a compilation, which must end before the runtime is torn down.
    """

    def __init__(self, target: Callable[[], None], name: str, daemon: bool = False) -> None:
        self._ended = threading.Event()

        def run() -> None:
            try:
                target()
            finally:
                self._ended.set()

        self.thread = threading.Thread(target=run, name=name, daemon=daemon)

    def start(self) -> Background:
        self.thread.start()
        return self

    def running(self) -> bool:
        """Whether it was started and its work has not ended."""
        return self.thread.ident is not None and not self._ended.is_set()

    def join(self) -> None:
        """Waits for the work to end. A Ctrl-C interrupts the wait, not the work, and leaves the
        thread joinable again (``Thread.join`` would mark it as ended)."""
        if self.thread.ident is not None:
            self._ended.wait()


class shielded:  # noqa: N801 - a context manager, named as contextlib's are
    """Holds SIGINT and SIGTERM while the body runs, and delivers them once it has ended.

    A signal that came meanwhile goes, after the body, to the handler that was there before
    (Python's: KeyboardInterrupt; ``deferred_signals``': noted for the next step's end), once;
    a SIGINT not at all when an exception already leaves the body or the code around it (fit
    stopping on an interrupt raises that one, not a second), a SIGTERM not when ``Preempted``
    does. Only in the main thread, and only over Python's own handlers or ``deferred_signals``'.

    Args:
        what: what the body does, named in the line written to stderr when a signal is held.

    Example:
        >>> from easyfit._interrupts import shielded
        >>> with shielded("the join"):
        ...     pass  # a Ctrl-C here is raised after the body, not inside it
    """

    def __init__(self, what: str = "the work in progress") -> None:
        self.what = what
        self.held: list[int] = []
        self._previous: dict[int, Any] = {}

    def _hold(self, signum: int, frame: Any) -> None:
        self.held.append(signum)
        name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        os.write(2, f"easyfit: {name} noted: stopping after {self.what}\n".encode())

    def __enter__(self) -> shielded:
        if threading.current_thread() is threading.main_thread():
            for s, default in _DEFAULTS.items():
                handler = signal.getsignal(s)
                if handler is default or getattr(handler, DEFERS, False):
                    self._previous[s] = handler
                    signal.signal(s, self._hold)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        leaving = error if error is not None else sys.exc_info()[1]  # the body's, or one around it
        for s in dict.fromkeys(self.held):  # each signal once, in the order they came
            if s == signal.SIGINT and leaving is not None:
                continue  # already on the way out: the interrupt is raised once
            if s == signal.SIGTERM and isinstance(leaving, Preempted):
                continue
            signal.raise_signal(s)  # to the handler put back: raises here, or notes, or ends
