"""Ctrl-C during fit, delivered between steps rather than in the middle of one.

A KeyboardInterrupt raised while a train step is being dispatched can lose the step's result
after the step has already consumed (donated) the previous state: nothing would be left to back
up. Inside ``deferred_sigint``, a first SIGINT only sets a flag, which fit checks after each
step and turns into a KeyboardInterrupt at that safe point; a second SIGINT interrupts at once,
as usual. Only in the main thread, and only when SIGINT has Python's default handler (a handler
the user installed is left alone).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

__all__ = ["deferred_sigint"]


@contextlib.contextmanager
def deferred_sigint() -> Iterator[Callable[[], bool]]:
    """Yields a function telling whether a SIGINT arrived since entering.

    Example:
        >>> from easyfit._interrupt import deferred_sigint
        >>> with deferred_sigint() as interrupted:
        ...     interrupted()  # True once a Ctrl-C has come
        False
    """
    pending = threading.Event()
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield pending.is_set
        return

    def note(signum, frame):
        pending.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second one interrupts

    signal.signal(signal.SIGINT, note)
    try:
        yield pending.is_set
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
