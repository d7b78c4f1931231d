"""DALI pipelines -> global batches: the only place where sources meet devices.

On GPU machines, several pipelines per local GPU, each preparing a part of this device's rows
of every chunk; they run on the GPU (``device_id``) only when the source decodes there, else on
the host, and the loader copies the chunk to the devices. On a CPU-only machine, one pipeline
(several CPU pipelines would all land on CPU device 0, so the loader places the batch with the
sharding itself). Each pipeline is fed by an ``external_source`` whose callback
asks the :class:`~easyfit.data.order.Plan` which samples make up the chunk DALI is preparing; DALI
reads and decodes them ahead of time (``prefetch_queue_depth``) in its own threads.

The stream is infinite: chunk ``i`` of the stream belongs to epoch ``i // chunks_per_epoch``, so
epochs follow each other without a pipeline reset and prefetching crosses epoch ends.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import DataError
from ..parallel import Placement
from .base import Source
from .images import first_line
from .order import Plan

__all__ = ["Loader", "default_num_threads", "make_loader", "on_gpu_pipelines", "run_rows"]


def _cores() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1


def default_num_threads(platform: str, pipelines: int) -> int:
    """DALI worker threads per pipeline.

    On a CPU-only machine training itself needs the cores, so DALI gets half of them. On GPU
    machines each pipeline gets its share of the cores, capped at 8 (more does not help; see
    docs/performance.md).
    """
    cores = _cores()
    if platform == "cpu":
        return max(1, cores // 2)
    return max(1, min(8, cores // max(1, pipelines)))


#: Most rows one pipeline run prepares: DALI's throughput falls steeply with larger batches
#: (one pipeline, 28x28 JPEGs on an H200 machine: ~89,000 samples/s at 200 rows a run, ~33,000
#: at 6,000; docs/performance.md), so a pipeline's share of a chunk is prepared in several runs.
RUN_ROWS = 256


def run_rows(rows: int) -> int:
    """Rows of one run of a reader pipeline, which must split a chunk's ``rows`` evenly: their
    largest divisor up to :data:`RUN_ROWS`, or ``rows`` itself (one run) when that divisor is
    under ``RUN_ROWS // 8``, for which the runs would cost more than they save.

    Example:
        >>> from easyfit.data.loader import run_rows
        >>> run_rows(6000), run_rows(200), run_rows(514)
        (250, 200, 514)
    """
    best = max(d for d in range(1, min(rows, RUN_ROWS) + 1) if rows % d == 0)
    return best if best >= min(rows, RUN_ROWS // 8) else rows


class _Feeder:
    """The external_source callback of one pipeline: its rows of each chunk, prepared in
    ``len(parts)`` runs (run ``j`` feeds part ``j % len(parts)`` of chunk ``start + j // len(parts)``).
    """

    def __init__(self, source: Source, plan: Plan, rows: np.ndarray, start: int):
        self.source, self.plan, self.start, self.rows = source, plan, start, rows
        self.parts = np.array_split(rows, -(-len(rows) // RUN_ROWS))
        self._lock = threading.Lock()
        self._order: tuple[int, np.ndarray] | None = None

    def chunk(self, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        epoch = self.plan.epoch_of(iteration)
        with self._lock:
            if self._order is None or self._order[0] != epoch:
                self._order = (epoch, self.plan.order(epoch))
            order = self._order[1]
        return self.plan.chunk(iteration, order)

    def __call__(self, info: Any) -> Any:
        chunk, part = divmod(info.iteration, len(self.parts))
        idx, _ = self.chunk(self.start + chunk)
        return tuple(self.source.feed(idx[self.parts[part]]))


class Loader:
    """Iterates over chunks of global batches: dicts of ``x``, ``y`` and ``mask`` jax.Arrays.

    Each array has ``steps_per_execution * batch_size`` rows, sharded over the mesh's data axis
    and laid out shard-major (see :meth:`Plan.chunk`); the step function unfolds them.

    Args:
        source: what to read.
        plan: which samples make up each chunk.
        placement: the devices and shardings.
        start: index of the first chunk (resume).
        position: a position from :meth:`position` to start at instead of ``start``.
        num_threads: DALI threads per pipeline (None: :func:`default_num_threads`).
        prefetch: DALI's prefetch queue depth.
        pipelines_per_device: DALI pipelines feeding each GPU, each with its share of the
            device's rows (None: 3 when each GPU has at least 12 cores, 2 from 8, else 1: one
            pipeline's executor tops out before the cores do on small images; see
            docs/performance.md). On a CPU-only machine: pipelines in all (None: 1).
        threaded: assemble global batches in a background thread, ``ahead`` chunks in advance,
            so that the training thread only dispatches (None: on GPUs, where the host would
            otherwise be the bottleneck; see docs/performance.md).
        ahead: chunks the background thread may hold ready once training runs (None: 2).
            Until the consumer takes its second chunk (while the first step compiles), it may
            run further ahead: up to an epoch, within 256 MiB.
        training: apply the source's ``augment`` (training batches only).

    Attributes:
        iteration: index of the next chunk ``__next__`` returns.
    """

    def __init__(self, source: Source, plan: Plan, placement: Placement, *, start: int = 0,
                 position: Mapping[str, Any] | None = None, num_threads: int | None = None,
                 prefetch: int = 2, pipelines_per_device: int | None = None,
                 threaded: bool | None = None, ahead: int | None = None, training: bool = False):
        self.source, self.plan, self.placement = source, plan, placement
        self.training, self.prefetch = training, prefetch
        if position is not None:
            start = int(position["chunk"])
        self.iteration = start
        self._peeked: dict[str, jax.Array] | None = None
        self._threaded = placement.platform == "gpu" if threaded is None else threaded
        chunk_bytes = (source.sample_nbytes or 2**20) * plan.steps_per_execution * plan.batch_size
        self._ahead = ahead or 2
        self._ahead_at_start = max(self._ahead, min(plan.chunks_per_epoch, 2**28 // chunk_bytes))
        self._thread: threading.Thread | None = None
        self._on_gpu = on_gpu_pipelines(source, placement)
        local, per = placement.local_shards, plan.rows_per_shard
        if placement.platform == "gpu":  # (rows, device) of each pipeline: part of a device's rows
            cores = _cores() // len(local)
            parts = pipelines_per_device or (3 if cores >= 12 else 2 if cores >= 8 else 1)
            specs = [(rows, d if self._on_gpu else None) for s, d in local
                     for rows in np.array_split(np.arange(s * per, (s + 1) * per), parts)]
        else:  # host pipelines for all local rows (default one: training needs the cores)
            rows = np.concatenate([np.arange(s * per, (s + 1) * per) for s, _ in local])
            specs = [(part, None) for part in np.array_split(rows, pipelines_per_device or 1)]
        self._devices = [d for _, d in specs]
        threads = num_threads or default_num_threads(placement.platform, len(specs))
        self._feeders = [_Feeder(source, plan, rows, start) for rows, _ in specs]
        self._pipes = [self._build(f, len(f.parts[0]), threads,
                                   d.local_hardware_id if d is not None else None, prefetch)
                       for f, (_, d) in zip(self._feeders, specs)]
        # each pipeline waited for and refed in its own thread: none idles while another is late
        self._pool = (concurrent.futures.ThreadPoolExecutor(len(self._pipes), "easyfit-pipeline")
                      if self._threaded and len(self._pipes) > 1 else None)

    def _build(self, feeder: _Feeder, batch: int, threads: int, device_id: int | None,
               prefetch: int):
        from nvidia.dali import fn, pipeline_def

        source = self.source
        where = "gpu" if device_id is not None else "cpu"

        # DALI's pipeline_def stub types device_id as int; its docs take None (CPU only)
        @pipeline_def(batch_size=batch, num_threads=threads, device_id=device_id,  # type: ignore[arg-type]
                      seed=self.plan.seed, prefetch_queue_depth=prefetch)
        def pipeline():
            nodes = fn.external_source(source=feeder, batch=True, batch_info=True,
                                       num_outputs=source.num_feeds)
            return augmented(source, source.graph(*nodes, device=where), self.training)

        pipe = pipeline()
        pipe.build()
        return pipe

    def position(self) -> dict[str, Any]:
        """Where the stream stands: an opaque, JSON-serialisable dict to save with a checkpoint
        and give back as ``Loader(..., position=...)`` to go on with the next chunk.

        For these index-driven sources the sample order is a pure function of (seed, epoch), so
        the position is just the index of the next chunk, ``{"chunk": i}``, and resuming needs
        no state from DALI. A loader built on DALI's own readers (LMDB, TFRecord, ...), which
        keep their own order, would build its pipelines with ``enable_checkpointing=True`` and
        put the strings of the pipelines' ``checkpoint()`` (the DALI iterator's
        ``checkpoints()``) in this dict, to restore them with ``checkpoint=`` when rebuilding.
        """
        return {"chunk": self.iteration}

    def __iter__(self) -> Loader:
        return self

    def __next__(self) -> dict[str, jax.Array]:
        if self._peeked is not None:
            item, self._peeked = self._peeked, None
        elif self._threaded:
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
        else:
            try:
                item = self._produce(self.iteration)
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

    def _produce(self, iteration: int) -> dict[str, jax.Array]:
        if self._pool is not None:
            outputs = list(self._pool.map(lambda i: self._share(i, iteration),
                                          range(len(self._pipes))))
        else:
            outputs = [self._share(i, iteration) for i in range(len(self._pipes))]
        _, mask = self._feeders[0].chunk(iteration)
        if self._on_gpu:
            x, y = (self.placement.shard_device_rows(self._per_device(arrays))
                    for arrays in zip(*outputs))
        else:  # host pipelines, in local row order: one copy of the whole chunk to the devices
            x, y = (self.placement.shard_host_rows(parts[0] if len(parts) == 1
                                                   else np.concatenate(parts))
                    for parts in zip(*outputs))
        return {"x": x, "y": y, "mask": self.placement.shard_global_rows(mask)}

    def _per_device(self, arrays: tuple[jax.Array, ...]) -> list[jax.Array]:
        """One array per local device, joining the parts of its pipelines (in row order)."""
        joined: dict[Any, list[jax.Array]] = {}
        for device, array in zip(self._devices, arrays):
            joined.setdefault(device, []).append(array)
        return [parts[0] if len(parts) == 1 else jnp.concatenate(parts)
                for parts in joined.values()]

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
                    item: Any = self._produce(iteration)
                except BaseException as e:  # handed to the consumer, raised there
                    item = e
                with self._ready:
                    self._ready.wait_for(room)
                    self._queue.append(item)
                    self._ready.notify_all()
                if isinstance(item, BaseException):
                    return
                iteration += 1

        self._thread = threading.Thread(target=work, args=(self.iteration,), daemon=True,
                                        name="easyfit-loader")
        self._thread.start()

    def _share(self, index: int, iteration: int) -> tuple[Any, Any]:
        """Pipeline ``index``'s rows of chunk ``iteration``: the outputs of its runs, joined."""
        pipe, count = self._pipes[index], len(self._feeders[index].parts)
        return self._join([self._run(pipe, iteration) for _ in range(count)])

    def _join(self, runs: list[tuple[Any, Any]]) -> tuple[Any, Any]:
        """The ``(x, y)`` outputs of consecutive runs of one pipeline, as one ``(x, y)``."""
        if len(runs) == 1:
            return runs[0]
        join = jnp.concatenate if self._on_gpu else np.concatenate
        x, y = (join(parts) for parts in zip(*runs, strict=True))
        return x, y

    def _run(self, pipe, iteration: int) -> tuple[Any, Any]:
        try:
            outs = pipe.run()
        except RuntimeError as e:
            raise batch_error(self.source, e, self._suspects(iteration)) from None
        return tuple(self._convert(o, name) for o, name in zip(outs, ("x", "y")))

    def _suspects(self, iteration: int) -> list[int]:
        """The samples DALI may have been reading: this chunk's and those prefetched after it."""
        chunks = range(iteration, iteration + self.prefetch + 2)
        return [int(i) for c in chunks for i in self._feeders[0].chunk(c)[0]]

    def _convert(self, out: Any, name: str) -> Any:
        if not out.is_dense_tensor():
            shapes = sorted({tuple(out[i].shape()) for i in range(len(out))})
            raise DataError(f"{self.source.describe()}: samples of {name} differ in shape "
                            f"({shapes[0]} and {shapes[-1]}); for images pass "
                            "image_size=(height, width) to resize them all")
        if not self._on_gpu:
            return out.as_array()
        tensor = out.as_tensor()
        array = jax.dlpack.from_dlpack(tensor)
        return array if self._pipes[0].exec_dynamic else array.copy()

    def close(self) -> None:
        """Stops the prefetching thread and releases the pipelines."""
        if self._thread is not None:
            self._stop.set()
            with self._ready:
                self._ready.notify_all()
            self._thread.join()
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self._pipes.clear()


def on_gpu_pipelines(source: Source, placement: Placement) -> bool:
    """Whether the pipelines run on the GPUs (``device_id`` set, outputs in device memory).

    Only when the source runs operators there (``source.uses_gpu``: the GPU image decoder).
    Otherwise the pipelines run on the host and the loader copies each whole chunk to the
    devices itself: one transfer per chunk instead of DALI's per-pipeline copies, streams and
    DLPack hand-overs, which cost more than the copy for small samples (docs/performance.md).
    """
    return placement.platform == "gpu" and source.uses_gpu


def augmented(source: Source, xy: tuple[Any, Any], training: bool) -> tuple[Any, Any]:
    """``(x, y)`` with the source's training augmentation applied to ``x`` when training."""
    x, y = xy
    return (source.augment(x) if training and source.augment is not None else x), y


def batch_error(source: Source, error: RuntimeError, suspects: list[int]) -> DataError:
    """A DataError for a batch DALI failed to produce, naming the bad sample when one is found."""
    culprit = source.diagnose(suspects)
    if culprit:
        return DataError(culprit)
    return DataError(f"{source.describe()}: DALI failed to produce a batch: {first_line(error)}")


def make_loader(source: Source, plan: Plan, placement: Placement, **kwargs: Any) -> Any:
    """The loader for ``source``: :class:`Loader`, or a ``ReaderLoader`` for a reader-driven
    source. Both iterate over dicts of ``x``, ``y``, ``mask`` and have ``plan`` and ``close``.
    Runs ``source.check()`` first.
    """
    source.check()
    if source.reader_driven:
        from .reader import ReaderLoader, ReaderSource

        assert isinstance(source, ReaderSource)  # the only reader-driven kind
        return ReaderLoader(source, plan, placement, **kwargs)
    return Loader(source, plan, placement, **kwargs)
