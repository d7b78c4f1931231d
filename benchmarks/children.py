"""What the benchmarks that measure each run in a fresh interpreter share: the script runs
itself again with extra arguments, from the environment the user gave, and reads the child's
one JSON line; a child times its epochs with a callback, or watches the interpreter lock.

Imported by its siblings as ``children`` (a script's own folder is first on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

#: The environment as the user gave it: every run's process starts from it.
USER_ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def run_again(script: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``script`` run again in a fresh interpreter with this process's arguments and ``extra``,
    in ``env`` (default :data:`USER_ENV`), its output captured."""
    cmd = [sys.executable, script, *sys.argv[1:], *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=USER_ENV if env is None else env)


def last_json(proc: subprocess.CompletedProcess, what: str) -> dict:
    """The JSON object on the last line of a child's stdout; ``SystemExit`` with the ends of
    its output when it failed."""
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def epoch_timer(ef: Any) -> tuple[list[float], Any]:
    """``(seconds, callback)``: the callback appends each epoch's seconds to ``seconds``, its
    end taken once the epoch's steps have run (its loss read on the host)."""
    seconds: list[float] = []
    clock: list[float] = []

    def begin(epoch, logs):
        clock[:] = [time.perf_counter()]

    def end(epoch, logs):
        float(logs["loss"])  # on the host: the epoch's steps have run
        seconds.append(time.perf_counter() - clock[0])

    return seconds, ef.callbacks.LambdaCallback(on_epoch_begin=begin, on_epoch_end=end)


def watch_lock(found: Callable[[float, float], None], least: float = 0.03) -> None:
    """Starts a daemon thread that sleeps 1 ms at a time and calls ``found(start, end)``
    (``time.time()`` values) for each stretch over ``least`` seconds in which it could not take
    the interpreter lock back: native code held it all along (Python threads hand it over every
    5 ms), so nothing else in the process ran Python meanwhile."""

    def watch() -> None:
        while True:
            before = time.time()
            time.sleep(0.001)
            after = time.time()
            if after - before > least:
                found(before, after)

    threading.Thread(target=watch, daemon=True, name="lock-watch").start()
