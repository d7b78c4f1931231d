"""Fit's loop over its training stream: its start (:class:`FirstStep`) and its epochs
(:class:`EpochLoop`).

**The start.** What a fit starts before its first step is one object with one ``close()``. The
devices' runtime warms up in a thread while the input is listed; the training stream's first
chunk is read once (or its shapes taken from the pipelines' first run) and kept for the first
step; the model's state is made from it; the steps the epochs train are compiled ahead in
background threads (the first chunk's while the state is made, the others while the first
chunks train: two compilations at once stalled on a GPU). ``close()`` waits for those threads
and closes the stream, whatever Ctrl-C comes meanwhile.

**The epochs.** The batches of a fit's epochs and the facts of each step, in the role of Keras'
epoch iterator and Levanter's ``StepInfo``: fit iterates an epoch's batches, runs the callbacks
around each step and reads back where the fit stands (:meth:`EpochLoop.progress`, the one place
the resume and progress snapshots are built) and the epoch's logs: its metrics and its
``input_wait``.

Am I input-bound? ``fit`` dispatches each step asynchronously, so when the devices outpace DALI
the training thread waits in the loader's ``__next__`` for the next chunk, and when DALI
outpaces the devices it waits in the dispatch instead. The time spent in ``__next__``
(``Loader.waited``) over the epoch's training time is therefore the share of the epoch the
devices waited for input (:class:`EpochInputWait`): the ``input_wait`` of the epoch logs. Above
:data:`INPUT_BOUND`, fit says so once, on a line of its own after the epoch's metrics, for the
first epoch whose input comes as in every later one: the first, or the second with the device
cache, whose first epoch streams the data while recording it (its wait says nothing of the
epochs that read the cache).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import jax

from .._interrupts import Background, shielded
from .._links import docs_url
from ..callbacks.callback_list import LazyLogs
from ..core.metrics import compute_on_host, epoch_logs
from ..errors import Preempted
from ..persistence.checkpoint import Progress

if TYPE_CHECKING:
    from ..core import steps

__all__ = ["INPUT_BOUND", "EpochInputWait", "EpochLoop", "FirstStep", "compile_ahead"]

#: The share of an epoch spent waiting for input above which fit calls training input-bound.
INPUT_BOUND = 0.25


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


class EpochLoop:
    """The epochs of one fit over the stream that ``first`` (a :class:`FirstStep`) started.

    Args:
        first: the fit's start: its stream, the first chunk and the compilations.
        compiled: the compiled steps.
        empty_metrics: a fresh metric accumulator, placed on the devices.
        epoch: the first epoch.
        batch: the batch the first epoch starts at (a fit resumed mid-epoch).
        metrics: the first epoch's metric accumulator so far (resumed), or None.
    """

    def __init__(
        self,
        first: FirstStep,
        compiled: steps.Compiled,
        empty_metrics: Callable[[], Any],
        *,
        epoch: int = 0,
        batch: int = 0,
        metrics: Any = None,
    ):
        self.plan = first.stream.plan
        #: The epoch whose input wait is said (when large): the first whose input comes as in
        #: every later one.
        self._said_epoch = epoch + first.stream.warmup_epochs
        self._waiting: EpochInputWait | None = None
        self._first = first
        self._compiled = compiled
        self._empty = empty_metrics
        self._batch = batch
        self.metrics = metrics

    @property
    def mid_epoch(self) -> bool:
        """Whether the coming epoch resumes in its middle."""
        return self._batch > 0

    def batches(self) -> Iterator[tuple[int, Mapping[str, Any]]]:
        """The coming epoch's ``(batch, chunk)``, chunks read as they are asked for; its input
        wait measured from the first."""
        self._waiting = EpochInputWait(self._first.stream)
        if self.metrics is None:
            self.metrics = self._empty()
        for batch in range(self._batch, self.plan.chunks_per_epoch):
            yield batch, self._first.next_chunk()

    def train(self, state: Any, batch: int, chunk: Mapping[str, Any]) -> Any:
        """Trains ``chunk`` (batch ``batch`` of its epoch) from ``state``; the new state."""
        live = self.plan.live_steps(batch)
        self._first.ready(live)
        state, self.metrics = self._compiled.train(live)(state, self.metrics, chunk)
        return state

    def running_logs(self) -> LazyLogs:
        """The epoch's metrics so far, read from the devices only when read."""
        return LazyLogs(functools.partial(compute_on_host, self.metrics))

    def progress(self, epoch: int, batch: int) -> Progress:
        """Where the fit stands with ``batch`` dispatches of ``epoch`` trained (0: the epoch
        not begun), the epoch's metrics with them."""
        metrics = self.metrics if batch > 0 else None
        return Progress(epoch, batch, self._first.position(), metrics, self.plan)

    def end_epoch(self, state: Any, epoch: int) -> dict[str, float]:
        """Epoch ``epoch``'s logs: its metrics, read from the devices, and its ``input_wait``
        (measured once they are read); the next epoch starts afresh."""
        logs = epoch_logs(self.metrics, state)
        if self._waiting is not None:
            logs["input_wait"] = self._waiting.finish(epoch)
        self.metrics, self._batch = None, 0
        return logs

    def report_input_wait(self, epoch: int) -> None:
        """Prints that training is input-bound, when it is, after ``epoch``'s metrics line (a
        line of its own), for the first epoch whose input comes as in every later one only."""
        if epoch == self._said_epoch and self._waiting is not None:
            self._waiting.report()


class EpochInputWait:
    """Measures one epoch: create it when the epoch starts, read :meth:`share` once the epoch's
    work is done (after its metrics were read from the device)."""

    def __init__(self, loader: Any):
        self.loader = loader
        self.start = time.perf_counter()
        self.waited_before = loader.waited

    def finish(self, epoch: int) -> float:
        """The epoch's share of waiting, measured now; :meth:`report` prints what it means."""
        share, waited, total = self.share()
        self._advice = self.advice(epoch, share, waited, total)
        return share

    def report(self) -> None:
        """Prints :meth:`advice` for the finished epoch, if any (fit calls it after the
        epoch's metrics line, so that it stands on a line of its own)."""
        if getattr(self, "_advice", None):
            print(self._advice, flush=True)

    def share(self) -> tuple[float, float, float]:
        """``(share, seconds waited, seconds of the epoch)``."""
        total = max(time.perf_counter() - self.start, 1e-9)
        waited = max(self.loader.waited - self.waited_before, 0.0)
        return min(waited / total, 1.0), waited, total

    @staticmethod
    def advice(epoch: int, share: float, waited: float, total: float) -> str | None:
        """The line fit prints when the devices waited for input more than :data:`INPUT_BOUND`
        of the epoch, else None.

        Example:
            >>> from easyfit.training.fit_loop import EpochInputWait
            >>> advice = EpochInputWait.advice(0, 0.62, 1.24, 2.0)
            >>> print(advice.replace("; see ", ";\\n"))
            easyfit: the devices waited for input 62% of epoch 1 (1.2 s of 2.0 s): training is input-bound;
            https://easyfit-flax.readthedocs.io/en/latest/performance/#am-i-input-bound
            >>> EpochInputWait.advice(0, 0.1, 0.2, 2.0) is None
            True
        """
        if share <= INPUT_BOUND:
            return None
        return (
            f"easyfit: the devices waited for input {share:.0%} of epoch {epoch + 1} "
            f"({waited:.1f} s of {total:.1f} s): training is input-bound; see "
            + docs_url("performance.md#am-i-input-bound")
        )
