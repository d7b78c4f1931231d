"""Ctrl-C and SIGTERM during fit, delivered between steps rather than in the middle of one.

A KeyboardInterrupt raised while a train step is being dispatched can lose the step's result
after the step has already consumed (donated) the previous state: nothing would be left to back
up. Inside ``deferred_signals``, a first SIGINT or SIGTERM only sets a flag, which fit checks
after each step and turns, at that safe point, into a KeyboardInterrupt (SIGINT) or a
``easyfit.errors.Preempted`` exit (SIGTERM, which job schedulers send before they preempt
a job). Either way the callbacks' ``on_interrupt`` (BackupAndRestore writes its backup) and
``on_train_end`` run first. A second signal of the same kind acts at once, as usual. Only in the
main thread, and only for a signal that has Python's default handler (a handler the user
installed is left alone). What must not be cut short (joins, closing pipelines, a save) runs
``easyfit._interrupts.shielded``, which holds the signals for this handler too.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from .._interrupts import DEFERS
from ..errors import Preempted

__all__ = ["Stop", "deferred_signals"]

_DEFAULTS: dict[int, Any] = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


class Stop:
    """Which deferred signal arrived first, if any. Calling it tells whether one did."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self) -> bool:
        return self.signum is not None

    def exception(self) -> BaseException:
        """What fit raises once it has stopped: KeyboardInterrupt for SIGINT, Preempted for
        SIGTERM."""
        return Preempted() if self.signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def deferred_signals() -> Iterator[Stop]:
    """Yields a :class:`Stop` telling whether a SIGINT or SIGTERM arrived since entering.

    Example:
        >>> from easyfit.training.interrupt import deferred_signals
        >>> with deferred_signals() as stop:
        ...     stop()  # True once a Ctrl-C or a SIGTERM has come
        False
    """
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    taken = [s for s, default in _DEFAULTS.items() if signal.getsignal(s) is default]

    def note(signum, frame):
        if stop.signum is None:
            stop.signum = signum
        signal.signal(signum, _DEFAULTS[signum])  # a second one acts at once

    setattr(note, DEFERS, True)  # a shield holds signals for it, as for Python's own

    for s in taken:
        signal.signal(s, note)
    try:
        yield stop
    finally:
        for s in taken:
            signal.signal(s, _DEFAULTS[s])
