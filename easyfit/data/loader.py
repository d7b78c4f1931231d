"""DALI pipelines -> global batches: the only place where sources meet devices.

One pipeline per local GPU (``device_id``, this device's rows of every chunk), or one pipeline on
a CPU-only machine (several CPU pipelines would all land on CPU device 0, so the loader places the
batch with the sharding itself). Each pipeline is fed by an ``external_source`` whose callback
asks the :class:`~easyfit.data.order.Plan` which samples make up the chunk DALI is preparing; DALI
reads and decodes them ahead of time (``prefetch_queue_depth``) in its own threads.

The stream is infinite: chunk ``i`` of the stream belongs to epoch ``i // chunks_per_epoch``, so
epochs follow each other without a pipeline reset and prefetching crosses epoch ends.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import jax
import numpy as np

from ..errors import DataError
from ..parallel import Placement
from .base import Source
from .images import first_line
from .order import Plan

__all__ = ["Loader", "default_num_threads", "make_loader"]


def default_num_threads(platform: str, pipelines: int) -> int:
    """DALI worker threads per pipeline.

    On a CPU-only machine training itself needs the cores, so DALI gets half of them. On GPU
    machines each pipeline gets its share of the cores, capped at 8 (more does not help; see
    docs/performance.md).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    if platform == "cpu":
        return max(1, cores // 2)
    return max(1, min(8, cores // max(1, pipelines)))


class _Feeder:
    """The external_source callback of one pipeline: its rows of chunk ``start + iteration``."""

    def __init__(self, source: Source, plan: Plan, shards: list[int], start: int):
        self.source, self.plan, self.start = source, plan, start
        rows = plan.rows_per_shard
        self.rows = np.concatenate([np.arange(s * rows, (s + 1) * rows) for s in shards])
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
        idx, _ = self.chunk(self.start + info.iteration)
        return tuple(self.source.feed(idx[self.rows]))


class Loader:
    """Iterates over chunks of global batches: dicts of ``x``, ``y`` and ``mask`` jax.Arrays.

    Each array has ``steps_per_execution * batch_size`` rows, sharded over the mesh's data axis
    and laid out shard-major (see :meth:`Plan.chunk`); the step function unfolds them.

    Args:
        source: what to read.
        plan: which samples make up each chunk.
        placement: the devices and shardings.
        start: index of the first chunk (resume).
        num_threads: DALI threads per pipeline (None: :func:`default_num_threads`).
        prefetch: DALI's prefetch queue depth.
        training: apply the source's ``augment`` (training batches only).
    """

    def __init__(self, source: Source, plan: Plan, placement: Placement, *, start: int = 0,
                 num_threads: int | None = None, prefetch: int = 2, training: bool = False):
        self.source, self.plan, self.placement = source, plan, placement
        self.training, self.prefetch = training, prefetch
        self.iteration = start
        self._on_gpu = placement.platform == "gpu"
        local = placement.local_shards
        groups = [[i] for i, _ in local] if self._on_gpu else [[i for i, _ in local]]
        threads = num_threads or default_num_threads(placement.platform, len(groups))
        self._mask_rows = np.concatenate(
            [np.arange(s * plan.rows_per_shard, (s + 1) * plan.rows_per_shard) for s, _ in local])
        self._feeders = [_Feeder(source, plan, g, start) for g in groups]
        devices = [d for _, d in local]
        self._pipes = [self._build(f, len(g) * plan.rows_per_shard, threads,
                                   devices[k].local_hardware_id if self._on_gpu else None, prefetch)
                       for k, (f, g) in enumerate(zip(self._feeders, groups))]

    def _build(self, feeder: _Feeder, batch: int, threads: int, device_id: int | None,
               prefetch: int):
        from nvidia.dali import fn, pipeline_def

        source = self.source
        where = "gpu" if device_id is not None else "cpu"

        @pipeline_def(batch_size=batch, num_threads=threads, device_id=device_id,
                      seed=self.plan.seed, prefetch_queue_depth=prefetch)
        def pipeline():
            nodes = fn.external_source(source=feeder, batch=True, batch_info=True,
                                       num_outputs=source.num_feeds)
            return augmented(source, source.graph(*nodes, device=where), self.training)

        pipe = pipeline()
        pipe.build()
        return pipe

    def __iter__(self) -> Loader:
        return self

    def __next__(self) -> dict[str, jax.Array]:
        outputs = [self._run(p) for p in self._pipes]
        _, mask = self._feeders[0].chunk(self.iteration)
        self.iteration += 1
        if self._on_gpu:
            xs, ys = zip(*outputs)
            x, y = self.placement.shard_device_rows(xs), self.placement.shard_device_rows(ys)
        else:
            (x, y), = outputs
            x, y = self.placement.shard_host_rows(x), self.placement.shard_host_rows(y)
        return {"x": x, "y": y, "mask": self.placement.shard_host_rows(mask[self._mask_rows])}

    def _run(self, pipe) -> tuple[Any, Any]:
        try:
            outs = pipe.run()
        except RuntimeError as e:
            suspects = self._suspects()
            self.close()
            raise batch_error(self.source, e, suspects) from None
        return tuple(self._convert(o, name) for o, name in zip(outs, ("x", "y")))

    def _suspects(self) -> list[int]:
        """The samples DALI may have been reading: this chunk's and those prefetched after it."""
        chunks = range(self.iteration, self.iteration + self.prefetch + 2)
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
        self._pipes.clear()


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
    """
    if source.reader_driven:
        from .reader import ReaderLoader

        return ReaderLoader(source, plan, placement, **kwargs)
    return Loader(source, plan, placement, **kwargs)
