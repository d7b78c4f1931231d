"""The Loader: DALI pipelines -> chunks of global batches, sharded on the devices.

The Loader builds the pipeline kind its source needs (``easyfit.data.pipelines``): pipelines fed
by easyfit's sampler for an indexed source, or DALI's own readers for a reader-driven one. It
owns what both share: the stream's position, peeking, the background thread that assembles
chunks ahead of the training thread, and closing. The device caches (``easyfit.data.cache``,
``easyfit.data.reader_cache``) hand out chunks of the same form.

The stream is infinite: chunk ``i`` of the stream belongs to epoch ``i // chunks_per_epoch``, so
epochs follow each other without a pipeline reset and prefetching crosses epoch ends.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping
from typing import Any

import jax

from ..parallel import Placement
from .pipelines import FedPipelines
from .plan import Plan
from .reader_pipelines import ReaderPipelines
from .sources.base import IndexedSource, ReaderSource, Source

__all__ = ["Loader"]


class Loader:
    """Iterates over chunks of global batches: dicts of ``x``, ``y`` and ``mask`` jax.Arrays
    (``x`` and ``y`` dicts or tuples of them for structured arrays, and ``sample_weight`` when
    the source has weights: see ``Source.assemble``).

    Each array has ``steps_per_execution * batch_size`` rows, sharded over the mesh's data axis
    and laid out shard-major (see :meth:`Plan.chunk`); the step function unfolds them. Runs
    ``source.check()`` before building its pipelines.

    Args:
        source: what to read.
        plan: which samples make up each chunk (for a reader-driven source, :attr:`plan` adds
            the length of the reader's pass).
        placement: the devices and shardings.
        start: index of the first chunk (resume).
        position: a position from :meth:`position` to start at instead of ``start``.
        num_threads: DALI threads per pipeline (None: chosen from the cores).
        prefetch: DALI's prefetch queue depth.
        pipelines_per_device: DALI pipelines feeding each GPU, each with its share of the
            device's rows (None: 3 when each GPU has at least 12 cores, 2 from 8, else 1; see
            docs/performance.md). On a CPU-only machine: pipelines in all (None: 1).
        pipelines: reader pipelines per process on CPUs (reader-driven sources; None: 1).
        threaded: assemble global batches in a background thread, ``ahead`` chunks in advance,
            so that the training thread only dispatches (None: on GPUs, for indexed sources).
        ahead: chunks the background thread may hold ready once training runs (None: 2).
            Until the consumer takes its second chunk (while the first step compiles), it may
            run further ahead: up to an epoch, within 256 MiB.
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
        reader = isinstance(source, ReaderSource)
        if position is not None:
            start = int(position["chunk"])
        self._threaded = (
            (placement.platform == "gpu" and not reader) if threaded is None else threaded and not reader
        )  # a reader's position is read between chunks
        self._pipelines: FedPipelines | ReaderPipelines
        if isinstance(source, ReaderSource):
            self._pipelines = ReaderPipelines(
                source,
                plan,
                placement,
                start=start,
                position=position,
                num_threads=num_threads,
                prefetch=prefetch,
                training=training,
                pipelines=pipelines,
            )
        elif isinstance(source, IndexedSource):
            self._pipelines = FedPipelines(
                source,
                plan,
                placement,
                start=start,
                num_threads=num_threads,
                prefetch=prefetch,
                pipelines_per_device=pipelines_per_device,
                training=training,
                pool=self._threaded,
            )
        else:
            raise TypeError(
                f"source: {source.describe()} is neither an IndexedSource nor a "
                "ReaderSource (see easyfit.data.sources.base)"
            )
        self.plan = self._pipelines.plan
        self.iteration = self._pipelines.next if isinstance(self._pipelines, ReaderPipelines) else start
        self._peeked: dict[str, jax.Array] | None = None
        self.waited = 0.0
        chunk_bytes = (source.sample_nbytes or 2**20) * plan.steps_per_execution * plan.batch_size
        self._ahead = ahead or 2
        self._ahead_at_start = max(self._ahead, min(self.plan.chunks_per_epoch, 2**28 // chunk_bytes))
        self._thread: threading.Thread | None = None

    #: Epochs before input comes as in every later one (none: every epoch streams alike).
    warmup_epochs = 0

    def position(self) -> dict[str, Any]:
        """Where the stream stands: an opaque, JSON-serialisable dict to save with a checkpoint
        and give back as ``Loader(..., position=...)`` to go on with the next chunk.

        For an indexed source, ``{"chunk": i}``: the sample order is a pure function of (seed,
        data pass). For a reader-driven one, also the DALI pipelines' own checkpoints.
        """
        return self._pipelines.position(self.iteration)

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
        elif self._threaded:
            item = self._take()
        else:
            try:
                item = self._pipelines.produce(self.iteration)
            except BaseException:
                self.close()
                raise
        self.iteration += 1
        return item

    def peek(self) -> dict[str, jax.Array]:
        """The next chunk, without consuming it."""
        if self._peeked is None:
            batch = next(self)
            self.iteration -= 1
            self._peeked = batch
        return self._peeked

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
            while not self._stop.is_set():
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

        self._thread = threading.Thread(
            target=work, args=(self.iteration,), daemon=True, name="easyfit-loader"
        )
        self._thread.start()

    def close(self) -> None:
        """Stops the prefetching thread and releases the pipelines."""
        if self._thread is not None:
            self._stop.set()
            with self._ready:
                self._ready.notify_all()
            self._thread.join()
            self._thread = None
            self._queue.clear()
        self._peeked = None
        self._pipelines.close()
