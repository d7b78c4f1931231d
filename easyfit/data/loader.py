"""Opening a stream of a source: :func:`~easyfit.data.kinds.stream_request` decides once what
the stream is to be (its kind, whether it is cached, the plan it follows, where it starts: a
:class:`~easyfit.data.stream.StreamRequest`), and :func:`open_stream` opens it, streamed by a
:class:`Loader` or gathered from the device cache (:class:`~easyfit.data.cache.DeviceCache`).
Both implement :class:`~easyfit.data.stream.Stream`.

The Loader streams DALI pipelines of its source's kind as chunks of global batches, sharded on
the devices. It owns what both kinds share: the stream's position, peeking, the background
thread that assembles chunks ahead of the training thread, and closing. The stream is infinite:
chunk ``i`` belongs to epoch ``i // chunks_per_epoch``, so epochs follow each other without a
pipeline reset and prefetching crosses epoch ends.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping
from typing import Any, overload

import jax

from .._interrupts import Background, shielded
from ..parallel import Placement
from .kinds import Resume, decide_cache, kind_of, stream_plan, stream_request
from .plan import Plan
from .sources.base import Source
from .stream import LoaderOptions, Position, Stream, StreamRequest

__all__ = [
    "Loader",
    "LoaderOptions",
    "Resume",
    "decide_cache",
    "open_stream",
    "stream_plan",
    "stream_request",
]


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
    """The stream ``request`` asks for (:func:`stream_request`): gathered from the device cache
    when ``request.cached``, else streamed by a :class:`Loader` run with ``options``. The one
    way a training, evaluation or prediction stream opens.

    The form ``open_stream(source, plan, placement, cached=..., start=..., position=...,
    training=..., **loader_options)`` is kept: the request is then made from its arguments.
    """
    if not isinstance(request, StreamRequest):  # the form before requests
        return open_stream(*_as_request(request, options, placement, legacy, replan=True))
    loader_options = LoaderOptions.of(options if isinstance(options, LoaderOptions) else None)
    if request.cached:
        return request.kind.cache(request, lambda: Loader(request, loader_options), loader_options)
    return Loader(request, loader_options)


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
    return StreamRequest(
        source, kind, followed, placement, cached, "", start, position, training
    ), loader_options


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
