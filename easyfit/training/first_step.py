"""What a fit starts before its first step, in one object with one ``close()``.

The devices' runtime warms up in a thread while the input is listed; the training stream's
first chunk is read once (or its shapes taken from the pipelines' first run) and kept for the
first step; the model's state is made from it; the steps the epochs train are compiled ahead in
background threads (the first chunk's while the state is made, the others while the first
chunks train: two compilations at once stalled on a GPU). ``close()`` waits for those threads
and closes the stream, whatever Ctrl-C comes meanwhile.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import jax

from .._interrupts import Background, shielded
from ..core import steps
from ..errors import Preempted

__all__ = ["FirstStep"]

Chunk = Mapping[str, Any]


class FirstStep:
    """A fit's start (see the module's docstring).

    Args:
        warm_up: start the devices' runtime in a thread (a fit that has no state yet).
    """

    def __init__(self, warm_up: bool):
        if warm_up:  # the runtime starts while the input is listed and opened
            threading.Thread(target=_start_runtime, name="easyfit-runtime").start()
        self.stream: Any = None
        self._start: dict[str, Any] = {}  # the stream's position before its first chunk
        self._chunk: Chunk | None = None  # the first chunk, until the first step takes it
        self._compiling: dict[int, Background] = {}  # steps trained by a chunk -> compilation

    def start(
        self,
        stream: Any,
        first_count: int,
        *,
        peek_spec: bool,
        functions: Callable[[Chunk], steps.Compiled],
        shapes: Callable[[Chunk, steps.Compiled], tuple[Any, Any]],
        make_state: Callable[[Chunk, bool], None],
    ) -> steps.Compiled:
        """Starts the training ``stream`` and returns the compiled steps for it.

        Args:
            stream: the training stream (closed by :meth:`close`).
            first_count: the steps the first chunk trains.
            peek_spec: the chunk's shapes may come from the source or the pipelines' first run
                (the loss is known without reading labels): the state is then made while the
                chunk is read.
            functions: the compiled steps for a chunk (or its spec).
            shapes: the state's and the empty metrics' shapes for a chunk and the steps.
            make_state: makes (or checks) the state for a chunk (or its spec); with True, checks
                the chunk's labels too.
        """
        self.stream = stream
        self._start = dict(stream.position())  # read now: the stream moves on at once
        try:
            spec = stream.chunk_spec() if peek_spec else None
            chunk = next(stream) if spec is None else spec
            compiled = functions(chunk)
            abstract, empty = shapes(chunk, compiled)
            self._compile([first_count], compiled, abstract, empty, chunk)
            if spec is not None:  # the state from the spec's shapes, then the chunk itself
                make_state(spec, False)
                chunk = next(stream)
            self._chunk = chunk
            make_state(chunk, True)
            self.ready(first_count)
            plan = stream.plan
            ends = {plan.live_steps(0), plan.live_steps(plan.chunks_per_epoch - 1)}
            self._compile([n for n in ends if n != first_count], compiled, abstract, empty, chunk)
        except BaseException:
            self.close()
            raise
        return compiled

    def _compile(self, counts: list[int], compiled: steps.Compiled, *args: Any) -> None:
        if counts:
            with shielded("starting the compilation"):  # a Ctrl-C after the start finds it listed
                thread = compile_ahead([compiled.train(n) for n in counts], *args)
                self._compiling.update(dict.fromkeys(counts, thread))

    def ready(self, count: int) -> None:
        """Waits until the function that trains ``count`` steps of a chunk is compiled."""
        self._compiling[count].join()

    def next_chunk(self) -> Chunk:
        """The first chunk, read at the start, then the stream's next ones."""
        chunk, self._chunk = self._chunk, None
        return chunk if chunk is not None else next(self.stream)

    def position(self) -> dict[str, Any]:
        """The stream's position: where it started while the first chunk is still unused."""
        return self._start if self._chunk is not None else self.stream.position()

    def close(self) -> None:
        """Waits for the steps being compiled and closes the training stream (its thread and
        pipelines), whatever Ctrl-C comes meanwhile: a compilation or a loader thread still
        running when the interpreter exits aborts the process. Says so when fit stops on an
        interrupt while a step still compiles (seconds; minutes for a large model)."""
        running = [c for c in dict.fromkeys(self._compiling.values()) if c.running()]
        what = "the compilation in progress" if running else "closing the data loader"
        with shielded(what):
            if running and isinstance(sys.exc_info()[1], (KeyboardInterrupt, Preempted)):
                print(f"easyfit: stopping after {what}", file=sys.stderr, flush=True)
            for compilation in running:
                compilation.join()
            if self.stream is not None:
                self.stream.close()


def _start_runtime() -> None:
    """The devices' first computation: on a GPU, the runtime's own set-up (seconds, before any
    program of the model's) happens then, in a thread while the input is listed and its
    pipelines built; not a daemon, for the reason :func:`compile_ahead` gives."""
    try:
        jax.block_until_ready(jax.random.PRNGKey(0))
    except Exception:  # noqa: BLE001 - the state's creation meets and reports it
        pass


def compile_ahead(jitted: list[jax.stages.Wrapped], *args: Any) -> Background:
    """Compiles each of ``jitted``, one after the other, for ``args`` (arrays or
    ``jax.ShapeDtypeStruct`` with shardings) in a background thread, into the cache its calls
    use; join it before the first call.

    Lets the first step's compilation overlap the work before it (the model's initialisation,
    the input pipeline's start). A failure is left to the first call to report.

    The thread is not a daemon: a process that ends while it compiles (say after catching an
    error that fit raised meanwhile) waits for it, since a compilation still running when
    JAX's exit handler releases the backend aborts the process. Hence a
    :class:`~easyfit._interrupts.Background`, whose join a Ctrl-C cannot mark as done.
    """

    def work() -> None:
        for fn in jitted:
            try:
                fn.lower(*args).compile()
            except Exception:  # noqa: BLE001 - the real call compiles again and raises
                pass

    return Background(work, name="easyfit-compile").start()
