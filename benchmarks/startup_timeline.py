"""Where one ``benchmarks/startup.py`` run spends its time until the first step: a timeline of
easyfit's start-up functions (wall-clock timers around them, in every thread) and of JAX's
compilation events (trace, lowering, compilation or cache retrieval).

    python benchmarks/startup_timeline.py OUT.txt FOLDER [startup.py's arguments] --child easyfit

Runs one child of ``startup.py`` (``--child easyfit`` or ``--child loop``) in this process; set
``XDG_CACHE_HOME`` to an empty folder for a cold run. OUT.txt gets one line per event: start
and end (seconds from this process's start), duration, thread and name.

A ``gil held`` row is a stretch of at least 30 ms in which nothing else in the process could
run Python (``children.watch_lock``).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from children import watch_lock  # noqa: E402

START = float(os.environ.setdefault("STARTUP_T0", repr(time.time())))
ROWS: list[tuple[float, float, str, str]] = []


def record(name: str, start: float, end: float) -> None:
    ROWS.append((start - START, end - START, threading.current_thread().name, name))


def timed(owner: Any, attr: str, label: str) -> None:
    """Wraps ``owner.attr`` with a timer."""
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            record(label, start, time.time())

    setattr(owner, attr, wrapper)


def main() -> None:
    out = Path(sys.argv[1])
    sys.argv = [str(Path(__file__).with_name("startup.py")), *sys.argv[2:]]
    import jax
    from jax import monitoring

    def on_duration(event: str, seconds: float, **_: Any) -> None:
        if not event.endswith("compile_time_saved_sec"):
            end = time.time()
            record("jax " + event.rsplit("/", 1)[-1], end - seconds, end)

    monitoring.register_event_duration_secs_listener(on_duration)
    import nvidia.dali as dali

    from easyfit.core import state
    from easyfit.data import images, inputs, pipelines
    from easyfit.training import fit_loop, trainer

    timed(dali.Pipeline, "build", "dali Pipeline.build")
    for name in ("__init__", "_build", "produce", "chunk_spec"):
        timed(pipelines.FedPipelines, name, f"FedPipelines.{name}")
    timed(images, "peek_shapes", "images.peek_shapes")
    timed(inputs.DataInputs, "fit_data", "DataInputs.fit_data")
    timed(inputs.DataInputs, "train_loader", "DataInputs.train_loader")
    for name in (
        "__init__",
        "fit",
        "_functions",
        "_shapes",
        "_empty",
        "_ensure_state",
        "_init_state",
    ):
        timed(trainer.Trainer, name, f"Trainer.{name}")
    timed(fit_loop, "compile_ahead", "fit_loop.compile_ahead")
    timed(pipelines._Feeder, "__call__", "feed a run")
    timed(state.StateMaker, "make", "StateMaker.make")
    timed(state.StateMaker, "abstract", "StateMaker.abstract")
    timed(jax.stages.Lowered, "compile", "jax Lowered.compile")
    record("imports done", START, time.time())
    watch_lock(lambda start, end: record("gil held", start, end))
    import startup

    report = startup._report

    def at_first_step(t0: float, **extra: Any) -> None:
        now = time.time()
        record("first step", now, now)
        with open(out, "w") as f:
            for start, end, thread, name in sorted(ROWS):
                f.write(f"{start:8.3f} {end:8.3f} {end - start:7.3f} {thread[:18]:18s} {name}\n")
        report(t0, **extra)

    startup._report = at_first_step
    startup.main()


if __name__ == "__main__":
    main()
