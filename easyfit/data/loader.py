"""Opening a stream of a source: :func:`decide_cache` chooses whether it is cached, and
:func:`open_stream` opens it, streamed by a :class:`Loader` or gathered from the device cache
(:class:`~easyfit.data.cache.DeviceCache`). Both implement :class:`~easyfit.data.stream.Stream`.

The Loader streams DALI pipelines of its source's kind (:func:`~easyfit.data.kinds.kind_of`) as
chunks of global batches, sharded on the devices. It owns what both kinds share: the stream's
position, peeking, the background thread that assembles chunks ahead of the training thread, and
closing. The stream is infinite: chunk ``i`` belongs to epoch ``i // chunks_per_epoch``, so epochs
follow each other without a pipeline reset and prefetching crosses epoch ends.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from .._interrupts import Background, shielded
from ..parallel import Placement
from .cache import cache_budget
from .kinds import kind_of
from .plan import Plan
from .sources.base import Source
from .stream import Position, Stream

__all__ = ["Loader", "decide_cache", "open_stream", "stream_plan"]


def decide_cache(
    cache: bool | str,
    source: Source,
    placement: Placement,
    resume: Mapping[str, Any] | None = None,
    *,
    training: bool = True,
) -> tuple[bool, str]:
    """Whether to cache, and why (a sentence for the log): the one decision, for training,
    evaluation and prediction data alike.

    Args:
        cache: fit's ``cache``: ``"auto"``, True or False.
        source: the source (its ``sample_nbytes`` and ``random``).
        placement: the devices.
        resume: the loader position of the backup a fit resumes from, if any (a reader's
            order depends on caching: see ``SourceKind.resume_cache``).
        training: False for evaluation and prediction data, which ``cache=True`` does not
            force: they are cached when they fit (as with ``"auto"``), and never with False.
    """
    if not training and cache is not False:
        cache = "auto"
    use, why = _decide(cache, source, placement)
    return kind_of(source).resume_cache(cache, use, why, resume)


def stream_plan(
    source: Source, plan: Plan, placement: Placement, cached: bool, pipelines: int | None = None
) -> Plan:
    """The plan a stream of ``source`` follows, known before it is opened: ``plan``, or for a
    streamed reader-driven source ``plan`` with the reader pass's length
    (:func:`~easyfit.data.reader_pipelines.reader_plan`; ``pipelines``: reader pipelines per
    process on CPUs)."""
    return kind_of(source).plan(plan, placement, cached, pipelines)


def _decide(cache: bool | str, source: Source, placement: Placement) -> tuple[bool, str]:
    if cache not in ("auto", True, False):
        raise ValueError(f"cache={cache!r}: expected 'auto', True or False")
    if cache is False:
        return False, "cache=False: streaming from DALI every epoch"
    when = kind_of(source).fills
    if source.random:
        if cache is True:
            raise ValueError(
                "cache=True: the training source applies random augmentation, "
                "which must run every epoch; use cache=False or 'auto'"
            )
        return False, "random augmentation must run every epoch: streaming from DALI"
    if source.sample_nbytes is None:
        if cache is True:
            return True, f"cache=True: caching the decoded dataset {when}"
        return False, f"{source.describe()} does not tell its decoded size: streaming from DALI"
    need = source.sample_nbytes * source.num_samples
    budget = _agreed(cache_budget(placement))
    size = f"{_bytes(need)} per device, budget {_bytes(budget)}"
    if need > budget:
        return False, (
            f"the decoded dataset would not fit in device memory ({size}): streaming from DALI every epoch"
        )
    return True, f"caching the decoded dataset on the device {when} ({size})"


def _bytes(n: int) -> str:
    """``n`` bytes in MiB, or in KiB or bytes below one MiB (a small dataset is not "0 MiB").

    Example:
        >>> from easyfit.data.loader import _bytes
        >>> _bytes(300 * 2**20), _bytes(12_544), _bytes(100)
        ('300 MiB', '12 KiB', '100 B')
    """
    if n >= 2**20:
        return f"{n / 2**20:,.0f} MiB"
    return f"{n / 2**10:,.0f} KiB" if n >= 2**10 else f"{n} B"


def _agreed(budget: int) -> int:
    """Process 0's budget in every process: they must all make the same choice."""
    if jax.process_count() == 1:
        return budget
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int64(budget)))


def open_stream(
    source: Source,
    plan: Plan,
    placement: Placement,
    *,
    cached: bool,
    start: int = 0,
    position: Mapping[str, Any] | None = None,
    training: bool = False,
    **options: Any,
) -> Stream:
    """A stream of ``source`` following ``plan`` (as :func:`stream_plan` makes it), from chunk
    ``start`` or ``position``: gathered from the device cache when ``cached``, else streamed by
    a :class:`Loader` (``options``: its keyword arguments)."""
    plan = stream_plan(source, plan, placement, cached, options.get("pipelines"))
    if not cached:
        return Loader(source, plan, placement, start=start, position=position, training=training, **options)
    if position is not None:
        start = int(position["chunk"])

    def stream() -> Loader:
        return Loader(source, plan, placement, start=start, training=training, **options)

    keep = {k: options[k] for k in ("num_threads", "pipelines") if k in options}
    return kind_of(source).cache(source, plan, placement, stream, start=start, **keep)


class Loader:
    """Iterates over chunks of global batches: dicts of ``x``, ``y`` and ``mask`` jax.Arrays
    (``x`` and ``y`` dicts or tuples of them for structured arrays, and ``sample_weight`` when
    the source has weights: see ``Source.assemble``).

    Each array has ``steps_per_execution * batch_size`` rows, sharded over the mesh's data axis
    and laid out shard-major (see :meth:`Plan.chunk`); the step function unfolds them. Runs
    ``source.check()`` before building its pipelines.

    Args:
        source: what to read.
        plan: which samples make up each chunk; :attr:`plan` is this plan, made for the
            source's kind (``SourceKind.plan``; a plain Plan for a reader-driven source is
            completed with the length of the reader's pass).
        placement: the devices and shardings.
        start: index of the first chunk (resume).
        position: a position from :meth:`position` to start at instead of ``start``.
        num_threads: DALI threads per pipeline (None: chosen from the cores).
        prefetch: DALI's prefetch queue depth.
        pipelines_per_device: DALI pipelines feeding each GPU, each with its share of the
            device's rows (None: 3 when each GPU has at least 12 cores, 2 from 8, else 1; see
            [Am I input-bound?](performance.md#am-i-input-bound)). On a CPU-only machine:
            pipelines in all (None: 1).
        pipelines: reader pipelines per process on CPUs (reader-driven sources; None: 1).
        threaded: assemble global batches in a background thread, ``ahead`` chunks in advance,
            so that the training thread only dispatches (None: on GPUs, for indexed sources).
        ahead: chunks the background thread may hold ready once training runs (None: 2).
            Before the consumer takes its first chunk it prepares that one alone (the host's
            cores go to the model's tracing and initialisation meanwhile); until it takes its
            second (while the first step compiles), it may run further ahead: up to an epoch,
            within 256 MiB.
        training: apply the source's ``augment`` (training batches only).

    Attributes:
        iteration: index of the next chunk ``__next__`` returns.
        waited: seconds the consumer has spent in ``__next__``, waiting for its chunks: with
            asynchronous dispatch, the time the devices wait for input (``fit``'s
            ``input_wait``).
    """

    def __init__(
        self,
        source: Source,
        plan: Plan,
        placement: Placement,
        *,
        start: int = 0,
        position: Mapping[str, Any] | None = None,
        num_threads: int | None = None,
        prefetch: int = 2,
        pipelines_per_device: int | None = None,
        pipelines: int | None = None,
        threaded: bool | None = None,
        ahead: int | None = None,
        training: bool = False,
    ):
        source.check()
        self.source = source
        self.placement = placement
        kind = kind_of(source)
        if position is not None:
            start = int(position["chunk"])
        # a reader's position is read between chunks: no thread
        self._threaded = kind.planned and (placement.platform == "gpu" if threaded is None else threaded)
        self._pipelines = kind.pipelines(
            source,
            plan,
            placement,
            start=start,
            position=position,
            num_threads=num_threads,
            prefetch=prefetch,
            pipelines_per_device=pipelines_per_device,
            pipelines=pipelines,
            training=training,
            pool=self._threaded,
        )
        self.plan: Plan = self._pipelines.plan
        self.iteration = start if kind.planned else self._pipelines.next
        self._first = self.iteration  # the chunk the pipelines' first run belongs to
        self._lazy = not kind.planned  # a reader's position holds DALI's checkpoints
        self._position: Position | None = None  # the last one handed out, until the pipelines move
        self._position_at = start
        self._closed = False
        self._peeked: dict[str, jax.Array] | None = None
        self.waited = 0.0
        chunk_bytes = (source.sample_nbytes or 2**20) * plan.steps_per_execution * plan.batch_size
        self._ahead = ahead or 2
        self._ahead_at_start = max(self._ahead, min(self.plan.chunks_per_epoch, 2**28 // chunk_bytes))
        self._thread: Background | None = None

    #: Epochs before input comes as in every later one (none: every epoch streams alike).
    warmup_epochs = 0

    def position(self) -> Mapping[str, Any]:
        """Where the stream stands: an opaque mapping, JSON-serialisable as a dict, to save with
        a checkpoint and give back as ``Loader(..., position=...)`` to go on with the next chunk.

        For an indexed source, ``{"chunk": i}``: the sample order is a pure function of (seed,
        data pass). For a reader-driven one, also the DALI pipelines' own checkpoints, serialised
        only when the position is first read (a :class:`~easyfit.data.stream.Position`); read
        after the stream moved on, it is ``{"chunk": i}``, from which the reader resumes by
        reading the chunks before and dropping them.
        """
        if not self._lazy:
            return self._pipelines.position(self.iteration)
        if self._position is None or self._position_at != self.iteration:
            iteration = self.iteration
            self._position = Position(lambda: self._pipelines.position(iteration), {"chunk": iteration})
            self._position_at = iteration
        return self._position

    def _expire(self) -> None:
        """The stream moves on: an unread position falls back to its chunk index."""
        if self._position is not None:
            self._position.expire()
            self._position = None

    def __iter__(self) -> Loader:
        return self

    def __next__(self) -> dict[str, jax.Array]:
        start = time.perf_counter()
        try:
            return self._next()
        finally:
            self.waited += time.perf_counter() - start

    def _next(self) -> dict[str, jax.Array]:
        if self._peeked is not None:
            item = self._peeked
            self._peeked = None
        else:
            item = self._produce(peek=False)
        self.iteration += 1
        return item

    def _produce(self, peek: bool) -> dict[str, jax.Array]:
        if self._threaded:
            return self._take()
        if not peek:
            self._expire()  # the pipelines leave the state before this chunk
        try:
            return self._pipelines.produce(self.iteration, peek=peek)
        except BaseException:
            self.close()
            raise

    def peek(self) -> dict[str, jax.Array]:
        """The next chunk, without consuming it."""
        if self._peeked is None:
            start = time.perf_counter()
            try:
                self._peeked = self._produce(peek=True)
            finally:
                self.waited += time.perf_counter() - start
        return self._peeked

    def chunk_spec(self) -> dict[str, Any] | None:
        """The next chunk's ``jax.ShapeDtypeStruct`` leaves (``FedPipelines.chunk_spec``): as the
        source declares them, or from the first run of the first pipeline. Starts the background
        thread and waits for that run at most, never the whole chunk. None for a stream without
        that thread (CPU-only machines) or a reader-driven source."""
        if not self._threaded or self._peeked is not None or self.iteration != self._first:
            return None
        if self._thread is None:
            self._start_thread()
        return self._pipelines.chunk_spec()

    def _take(self) -> dict[str, jax.Array]:
        if self._thread is None:
            self._start_thread()
        with self._ready:
            self._ready.wait_for(lambda: self._queue)
            item = self._queue.popleft()
            self._taken += 1
            self._ready.notify_all()
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def _start_thread(self) -> None:
        self._queue: collections.deque = collections.deque()
        self._ready = threading.Condition()
        self._taken = 0
        self._stop = threading.Event()

        def room() -> bool:  # deep while the first step compiles, shallow once training runs
            cap = self._ahead_at_start if self._taken < 2 else self._ahead
            return len(self._queue) < cap or self._stop.is_set()

        def work(iteration: int) -> None:
            first = iteration
            while not self._stop.is_set():
                if iteration != first:  # the first chunk alone until the consumer takes it
                    with self._ready:
                        self._ready.wait_for(lambda: self._taken > 0 or self._stop.is_set())
                try:
                    item: Any = self._pipelines.produce(iteration)
                except BaseException as e:  # handed to the consumer, raised there
                    item = e
                with self._ready:
                    self._ready.wait_for(room)
                    self._queue.append(item)
                    self._ready.notify_all()
                if isinstance(item, BaseException):
                    return
                iteration += 1

        start = self.iteration
        self._thread = Background(lambda: work(start), daemon=True, name="easyfit-loader").start()

    def close(self) -> None:
        """Stops the prefetching thread and releases the pipelines (reading first the last
        position handed out, if the stream still stands there). A Ctrl-C meanwhile is held until
        they are (a loader thread left running while the interpreter exits crashes it)."""
        with shielded("closing the data loader"):
            self._close()

    def _close(self) -> None:
        if self._position is not None and not self._closed:
            try:
                self._position.settle()
            except Exception:  # pipelines that failed: the chunk index resumes as exactly
                self._position.expire()
            self._position = None
        self._closed = True
        if self._thread is not None:
            self._stop.set()
            with self._ready:
                self._ready.notify_all()
            self._thread.join()
            self._thread = None
            self._queue.clear()
        self._peeked = None
        self._pipelines.close()
