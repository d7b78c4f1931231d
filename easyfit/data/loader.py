"""A source's stream: what it is to be, decided once, and its opening.

:func:`stream_request` decides everything a stream is to be, as one
:class:`~easyfit.data.stream.StreamRequest`: its kind (who picks the sample order), whether it is
cached and why, the plan it follows, the read that fills its device cache when that is a read of
its own, and where it starts. :func:`open_stream` opens a request, for training and for the
kept evaluation and prediction streams alike, building downward from what it says and deciding
nothing again: a :class:`Loader` that streams the kind's DALI pipelines
(:mod:`easyfit.data.pipelines`), or the :class:`~easyfit.data.cache.DeviceCache`. Both
implement :class:`~easyfit.data.stream.Stream`.

The two kinds of source are told apart here alone (:func:`kind_of`):

* :data:`FED`, for an :class:`~easyfit.data.sources.base.IndexedSource`: easyfit's
  :class:`~easyfit.data.plan.Plan` picks the order and feeds DALI the samples; a position is a
  chunk index; the device cache records the first epoch while it streams.
* :data:`READ`, for a :class:`~easyfit.data.sources.base.ReaderSource`: DALI's reader picks the
  order; a position holds DALI's checkpoints; the device cache is filled by one unshuffled read
  of the source (the request's ``fill``), and then follows the Plan like the other kind.

The Loader owns what both kinds share: the stream's position, peeking, the background thread
that assembles chunks ahead of the training thread, and closing. The stream is infinite: chunk
``i`` belongs to epoch ``i // chunks_per_epoch``, so epochs follow each other without a pipeline
reset and prefetching crosses epoch ends.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, overload

import jax
import numpy as np

from .._interrupts import Background, shielded
from ..parallel import Placement
from .cache import DeviceCache, OrderedRead, Recording, cache_budget
from .pipelines import FedPipelines, ReaderPipelines, reader_plan
from .plan import Plan
from .sources.base import IndexedSource, ReaderSource, Source
from .stream import LoaderOptions, Position, Stream, StreamRequest

__all__ = [
    "FED",
    "READ",
    "Loader",
    "LoaderOptions",
    "ReaderKind",
    "Resume",
    "SourceKind",
    "decide_cache",
    "kind_of",
    "open_stream",
    "stream_plan",
    "stream_request",
]


class Resume(Protocol):
    """Where a fit resumes (``easyfit.persistence.checkpoint.ResumePoint``): what a training
    stream needs of it."""

    @property
    def epoch(self) -> int: ...

    @property
    def position(self) -> Mapping[str, Any] | None: ...

    def check(self, plan: Plan) -> None: ...


def stream_request(
    source: Source,
    plan: Plan | Callable[[bool], Plan],
    placement: Placement,
    *,
    cache: bool | str,
    options: LoaderOptions,
    training: bool = False,
    initial_epoch: int = 0,
    resume: Resume | None = None,
) -> StreamRequest:
    """What the stream of ``source`` is to be, decided once: its kind, whether it is cached and
    why (:func:`decide_cache`), the plan it follows (``plan``, or ``plan(cached)`` when the
    batching depends on the cache; completed for the kind: :func:`stream_plan`), the read that
    fills its cache when the kind fills it so, and where it starts: ``resume``'s position (its
    plan checked against the saved one), else ``initial_epoch``'s first chunk. ``training``:
    the fit's training data (see :func:`decide_cache`; augmented)."""
    kind = kind_of(source)
    position = resume.position if resume is not None else None
    cached, why = decide_cache(cache, source, placement, position, training=training, kind=kind)
    batching = plan(cached) if callable(plan) else plan
    followed = kind.plan(batching, placement, cached, options.pipelines)
    if resume is not None:
        resume.check(followed)
        initial_epoch = resume.epoch
    start = int(position["chunk"]) if position is not None else initial_epoch * followed.chunks_per_epoch
    fill = kind.fill(source, followed, placement, cached, options.pipelines)
    return StreamRequest(source, kind, followed, placement, cached, why, start, position, training, fill)


def decide_cache(
    cache: bool | str,
    source: Source,
    placement: Placement,
    resume: Mapping[str, Any] | None = None,
    *,
    training: bool = True,
    kind: SourceKind | None = None,
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
        kind: ``source``'s kind, when known already.
    """
    kind = kind or kind_of(source)
    if not training and cache is not False:
        cache = "auto"
    use, why = _decide(cache, source, placement, kind)
    return kind.resume_cache(cache, use, why, resume)


def stream_plan(
    source: Source, plan: Plan, placement: Placement, cached: bool, pipelines: int | None = None
) -> Plan:
    """The plan a stream of ``source`` follows, known before it is opened: ``plan``, or for a
    streamed reader-driven source ``plan`` with the reader pass's length
    (:func:`~easyfit.data.pipelines.reader_plan`; ``pipelines``: reader pipelines per
    process on CPUs). :func:`stream_request` makes it as part of a request."""
    return kind_of(source).plan(plan, placement, cached, pipelines)


def _decide(cache: bool | str, source: Source, placement: Placement, kind: SourceKind) -> tuple[bool, str]:
    if cache not in ("auto", True, False):
        raise ValueError(f"cache={cache!r}: expected 'auto', True or False")
    if cache is False:
        return False, "cache=False: streaming from DALI every epoch"
    when = kind.fills
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


class SourceKind:
    """What differs between the kinds of source: the plan a stream follows, how its device cache
    is filled, its pipelines, resuming. The base describes :data:`FED`; :data:`READ` overrides
    what differs."""

    #: Whether easyfit's Plan picks the sample order (so samples can be held out and a chunk
    #: can be assembled ahead, in a background thread).
    planned = True
    #: When the device cache is filled (for the log).
    fills = "after the first epoch"

    def plan(self, plan: Plan, placement: Placement, cached: bool, pipelines: int | None = None) -> Plan:
        """The plan a stream of this kind follows: ``plan``, or for a streamed reader the reader
        pass's length added (``pipelines``: reader pipelines per process on CPUs)."""
        return plan

    def fill(
        self, source: Source, plan: Plan, placement: Placement, cached: bool, pipelines: int | None = None
    ) -> StreamRequest | None:
        """The stream whose one read fills the device cache of a stream of ``source`` that
        follows ``plan``, when the cache is filled by a read of its own; None here: this kind's
        cache records the stream itself while it streams."""
        return None

    def pipelines(self, request: StreamRequest, options: LoaderOptions, pool: bool) -> Any:
        """The DALI pipelines of a streaming loader of ``request``, starting at its first chunk
        (``pool``: wait for and refeed each pipeline in its own thread)."""
        return FedPipelines(request, options, pool=pool)

    def resume_cache(
        self, cache: bool | str, use: bool, why: str, position: Mapping[str, Any] | None
    ) -> tuple[bool, str]:
        """Whether a fit resumed at ``position`` caches, given ``decide_cache``'s choice
        ``(use, why)``: that choice, since caching does not change this kind's order."""
        return use, why


class ReaderKind(SourceKind):
    """What differs for a :class:`~easyfit.data.sources.base.ReaderSource` (:data:`READ`)."""

    planned = False
    fills = "after one read by its DALI reader"

    def plan(self, plan: Plan, placement: Placement, cached: bool, pipelines: int | None = None) -> Plan:
        if cached:
            return plan
        if plan.shuffle == "batch":
            raise ValueError(
                "shuffle='batch': this source is read by DALI's reader in its own order, so "
                "easyfit cannot permute each batch of it; use shuffle=True (the reader's "
                "shuffle) or False, or cache=True (the cached data follows easyfit's order)"
            )
        return reader_plan(plan, placement, pipelines)

    def fill(
        self, source: Source, plan: Plan, placement: Placement, cached: bool, pipelines: int | None = None
    ) -> StreamRequest | None:
        """One pass of the reader in the source's own order, unshuffled, when cached: reading
        the reader's shuffled first epoch instead could not fill the cache of a fit resumed
        inside that epoch, and would make that epoch depend on the number of pipelines."""
        if not cached:
            return None
        whole = dataclasses.replace(plan, shuffle=False, epoch_steps=None)
        return StreamRequest(source, self, reader_plan(whole, placement, pipelines), placement, cached=False)

    def pipelines(self, request: StreamRequest, options: LoaderOptions, pool: bool) -> Any:
        return ReaderPipelines(request, options)

    def resume_cache(
        self, cache: bool | str, use: bool, why: str, position: Mapping[str, Any] | None
    ) -> tuple[bool, str]:
        """As the backup's fit did, since the reader's order differs with and without the
        cache: ``cache="auto"`` follows a backup written while streaming; any other difference
        is refused."""
        if position is None:
            return use, why
        cached = bool(position.get("cached"))
        if cached == use:
            return use, why
        if cache == "auto" and not cached:
            return False, "resuming a backup written while streaming: streaming from DALI every epoch"
        raise ValueError(
            f"cache={cache!r}: the backup was written {'with' if cached else 'without'} the device "
            f"cache, which orders a DALI reader's samples differently; resume with cache={cached} "
            "(or delete the backup to start afresh)"
        )


#: Sources fed by easyfit's Plan (:class:`~easyfit.data.sources.base.IndexedSource`).
FED = SourceKind()
#: Sources read by DALI's reader in its own order (:class:`~easyfit.data.sources.base.ReaderSource`).
READ = ReaderKind()


def kind_of(source: Source) -> SourceKind:
    """The kind of ``source``.

    Example:
        >>> import numpy as np, easyfit as ef
        >>> from easyfit.data.loader import FED, kind_of
        >>> kind_of(ef.data.Arrays(np.zeros((4, 2)), np.arange(4))) is FED
        True
    """
    if isinstance(source, ReaderSource):
        return READ
    if isinstance(source, IndexedSource):
        return FED
    raise TypeError(
        f"source: {source.describe()} is neither an IndexedSource nor a ReaderSource "
        "(see easyfit.data.sources.base)"
    )


@overload
def open_stream(request: StreamRequest, options: LoaderOptions | None = None, /) -> Stream: ...


@overload
def open_stream(
    request: Source,
    options: Plan,
    placement: Placement,
    /,
    *,
    cached: bool,
    start: int = 0,
    position: Mapping[str, Any] | None = None,
    training: bool = False,
    **loader_options: Any,
) -> Stream: ...


def open_stream(
    request: StreamRequest | Source,
    options: LoaderOptions | Plan | None = None,
    placement: Placement | None = None,
    /,
    **legacy: Any,
) -> Stream:
    """The stream ``request`` asks for (:func:`stream_request`), run with ``options``: the one
    way a training, evaluation or prediction stream opens. A :class:`Loader` streams it; when
    ``request.cached``, the device cache gathers it, filled by recording that loader or, when
    the request has a ``fill`` of its own, by that one read before the first chunk.

    The form ``open_stream(source, plan, placement, cached=..., start=..., position=...,
    training=..., **loader_options)`` is kept: the request is then made from its arguments.
    """
    request, loader_options = _as_request(request, options, placement, legacy, replan=True)
    fill: Recording | OrderedRead
    if request.fill is None:
        loader = Loader(request, loader_options)
        if not request.cached:
            return loader
        fill = Recording(loader)
    else:  # read once, in the source's order, before the first chunk
        request.source.check()
        read = request.fill
        read_options = LoaderOptions(
            num_threads=loader_options.num_threads, pipelines=loader_options.pipelines
        )
        fill = OrderedRead(lambda: read.kind.pipelines(read, read_options, pool=False))
    return DeviceCache(request.plan, request.placement, fill, start=request.start)


def _as_request(
    request: StreamRequest | Source,
    options: LoaderOptions | Plan | None,
    placement: Placement | None,
    legacy: dict[str, Any],
    replan: bool,
) -> tuple[StreamRequest, LoaderOptions]:
    """``(request, options)`` from either call form: a request and its options, or the form
    before requests, ``(source, plan, placement, cached=..., start=..., position=...,
    training=..., **loader options)``. ``replan``: ``start`` counts the chunks of the plan the
    stream follows (as :func:`open_stream` took it), else those of ``plan`` as given."""
    if isinstance(request, StreamRequest):
        if legacy or placement is not None:
            raise TypeError("a StreamRequest is opened with its LoaderOptions alone")
        return request, LoaderOptions.of(options if isinstance(options, LoaderOptions) else None)
    source, plan = request, options
    if not isinstance(plan, Plan) or placement is None:
        raise TypeError("expected (request, options) or (source, plan, placement, ...)")
    cached = bool(legacy.pop("cached", False))
    start = int(legacy.pop("start", 0))
    position = legacy.pop("position", None)
    training = bool(legacy.pop("training", False))
    loader_options = LoaderOptions.of(legacy)
    kind = kind_of(source)
    followed = kind.plan(plan, placement, cached, loader_options.pipelines)
    if position is not None:
        start = int(position["chunk"])
    elif not replan and followed is not plan:  # ``start`` counts ``plan``'s chunks
        epoch, rest = divmod(start, plan.chunks_per_epoch)
        start = epoch * followed.chunks_per_epoch + rest
    fill = kind.fill(source, followed, placement, cached, loader_options.pipelines)
    request = StreamRequest(source, kind, followed, placement, cached, "", start, position, training, fill)
    return request, loader_options


class Loader:
    """Iterates over chunks of global batches: dicts of ``x``, ``y`` and ``mask`` jax.Arrays
    (``x`` and ``y`` dicts or tuples of them for structured arrays, and ``sample_weight`` when
    the source has weights: see ``Source.assemble``).

    Each array has ``steps_per_execution * batch_size`` rows, sharded over the mesh's data axis
    and laid out shard-major (see :meth:`Plan.chunk`); the step function unfolds them. Runs
    ``source.check()`` before building its pipelines.

    Args:
        request: the stream to open (:func:`stream_request`): the source, its kind, the plan
            made for that kind (:attr:`plan`), the placement, the first chunk or the position
            to resume at, and whether the source's ``augment`` applies (training).
        options: how the DALI pipelines run (:class:`~easyfit.data.stream.LoaderOptions`).

    The form ``Loader(source, plan, placement, start=..., position=..., training=...,
    **loader_options)`` is kept: the request is then made from its arguments (a plain ``plan``
    of a reader-driven source is completed with the length of the reader's pass).

    Attributes:
        iteration: index of the next chunk ``__next__`` returns.
        waited: seconds the consumer has spent in ``__next__``, waiting for its chunks: with
            asynchronous dispatch, the time the devices wait for input (``fit``'s
            ``input_wait``).
    """

    @overload
    def __init__(self, request: StreamRequest, options: LoaderOptions | None = None, /) -> None: ...

    @overload
    def __init__(
        self,
        request: Source,
        options: Plan,
        placement: Placement,
        /,
        *,
        start: int = 0,
        position: Mapping[str, Any] | None = None,
        training: bool = False,
        **loader_options: Any,
    ) -> None: ...

    def __init__(
        self,
        request: StreamRequest | Source,
        options: LoaderOptions | Plan | None = None,
        placement: Placement | None = None,
        /,
        **legacy: Any,
    ):
        if "cached" in legacy:
            raise TypeError("Loader streams; open_stream(..., cached=True) gathers from the device cache")
        request, options = _as_request(request, options, placement, legacy, replan=False)
        request.source.check()
        self.source = request.source
        self.placement = request.placement
        planned = request.kind.planned
        # a reader's position is read between chunks: no thread
        on_gpu = request.placement.platform == "gpu"
        self._threaded = planned and (on_gpu if options.threaded is None else options.threaded)
        self._pipelines = request.kind.pipelines(request, options, pool=self._threaded)
        self.plan: Plan = request.plan
        self.iteration = request.start
        self._first_chunk = request.start  # the chunk the pipelines' first run belongs to
        self._lazy = not planned  # a reader's position holds DALI's checkpoints
        self._position: Position | None = None  # the last one handed out, until the pipelines move
        self._position_at = request.start
        self._closed = False
        self._peeked: dict[str, jax.Array] | None = None
        self.waited = 0.0
        chunk_bytes = (
            (self.source.sample_nbytes or 2**20) * self.plan.steps_per_execution * self.plan.batch_size
        )
        self._ahead = options.ahead or 2
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
        if not self._threaded or self._peeked is not None or self.iteration != self._first_chunk:
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
            opening = iteration
            while not self._stop.is_set():
                if iteration != opening:  # the first chunk alone until the consumer takes it
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
