"""Reader-driven sources: a DALI reader picks the order and the shards.

Some formats cannot be addressed sample by sample from Python without a new dependency (an
LMDB: its B-tree is read by DALI's own LMDB code). Their sources let DALI's reader
(``fn.readers.caffe2``, ...) read in its own order: each pipeline reads one contiguous shard
(``shard_id``/``num_shards``), shuffled inside a buffer when training, and pads the shard's end
with copies of its last sample (``pad_last_batch``), so that every shard yields the same number
of batches. The loader knows every shard's true size, so the padding is masked like any other.

What holds as for index-driven sources: exactly-once evaluation and prediction, the same masks,
steps and shardings, ``steps_per_execution``, augmentation. What does not: batches depend on the
number of pipelines (one per GPU; one per process on CPUs), so these sources are not
topology-independent; ``validation_split`` is not available; resuming at chunk ``start`` reads
and drops the chunks before it.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ..parallel import Placement
from .base import Source
from .loader import Loader, augmented, default_num_threads, on_gpu_pipelines, run_rows
from .order import Plan

__all__ = ["READER", "ReaderLoader", "ReaderPlan", "ReaderSource", "scan_for_bad_record",
           "shard_sizes"]

#: The name a ReaderSource gives its DALI reader (``fn.readers.*(..., name=READER)``).
READER = "reader"


def shard_sizes(num_samples: int, num_shards: int) -> np.ndarray:
    """Samples in each of DALI's shards: shard k is ``[k*n//s, (k+1)*n//s)``.

    Example:
        >>> from easyfit.data.reader import shard_sizes
        >>> shard_sizes(10, 3).tolist()
        [3, 3, 4]
    """
    bounds = np.arange(num_shards + 1, dtype=np.int64) * num_samples // num_shards
    return np.diff(bounds)


class ReaderSource(Source):
    """Base class of sources read by a DALI reader in its own order.

    Subclasses implement ``num_samples`` and :meth:`read`.
    """

    reader_driven = True

    @property
    def num_feeds(self) -> int:
        return 0

    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        raise TypeError(f"{self.describe()} is read by a DALI reader, not fed by index")

    def graph(self, *nodes: Any, device: str) -> tuple[Any, Any]:
        raise TypeError(f"{self.describe()} is read by a DALI reader: see read()")

    @abc.abstractmethod
    def read(self, *, shard_id: int, num_shards: int, shuffle: bool, device: str
             ) -> tuple[Any, Any]:
        """DALI graph from a reader named :data:`READER` to ``(x, y)`` nodes on ``device``.

        The reader must take ``shard_id``, ``num_shards``, ``random_shuffle=shuffle`` and
        ``pad_last_batch=True``.
        """

    def diagnose(self, suspects: Sequence[int]) -> str | None:
        """The first record, in reading order, that DALI cannot read or decode."""
        return scan_for_bad_record(self)


@dataclasses.dataclass(frozen=True)
class ReaderPlan(Plan):
    """A Plan whose epoch length is the padded shard length of a reader (``chunks`` chunks)."""

    chunks: int = 1

    @property
    def chunks_per_epoch(self) -> int:
        return self.chunks

    @property
    def steps_per_epoch(self) -> int:
        return self.chunks * self.steps_per_execution


class ReaderLoader(Loader):
    """Chunks of global batches from a :class:`ReaderSource`, like :class:`Loader`.

    One pipeline per local GPU (reader shard = the device's shard; on the host unless the
    source decodes on the GPU, see :func:`on_gpu_pipelines`), or on CPUs ``pipelines``
    per process (default 1), each reading one shard for an equal share of the local devices.
    ``plan`` gives the batch size, steps per execution, seed and whether to shuffle; the
    loader's own :attr:`plan` (a :class:`ReaderPlan`) adds the reader's epoch length.
    """

    def __init__(self, source: ReaderSource, plan: Plan, placement: Placement, *,
                 start: int = 0, position: dict[str, Any] | None = None,
                 num_threads: int | None = None, prefetch: int = 2, training: bool = False,
                 pipelines: int | None = None, **_unused: Any):
        self.source, self.placement = source, placement
        self.training, self.prefetch = training, prefetch
        self._peeked, self._threaded, self._thread, self._pool = None, False, None, None
        self._on_gpu = on_gpu_pipelines(source, placement)
        local = placement.local_shards
        per_process = len(local) if placement.platform == "gpu" else (pipelines or 1)
        if len(local) % per_process:
            raise ValueError(f"pipelines={pipelines}: must divide the {len(local)} local devices")
        size = len(local) // per_process
        groups = [list(range(k * size, (k + 1) * size)) for k in range(per_process)]
        readers = per_process * jax.process_count()
        ids = [jax.process_index() * per_process + k for k in range(per_process)]
        self._group = size
        batch = self._group * plan.rows_per_shard  # a pipeline's rows of each chunk
        run = run_rows(batch)  # read in runs of at most RUN_ROWS rows (see loader.RUN_ROWS)
        threads = num_threads or default_num_threads(placement.platform, len(groups))
        self._pipes = [self._build_reader(shard, readers, plan, run, threads,
                                          local[g[0]][1].local_hardware_id if self._on_gpu
                                          else None, prefetch)
                       for shard, g in zip(ids, groups, strict=True)]
        meta = self._pipes[0].reader_meta(READER)
        # each shard, padded to whole runs; a chunk holds batch // run of them, the epoch's last
        # chunk fewer (its other rows are masked copies)
        self._epoch_runs = -(-(meta["epoch_size_padded"] // readers) // run)
        self._chunk_runs = batch // run
        chunks = -(-self._epoch_runs // self._chunk_runs)
        self.plan = ReaderPlan(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan)},
                               chunks=chunks)
        self._sizes = shard_sizes(meta["epoch_size"], readers)
        self._stick = bool(meta["stick_to_shard"])
        self._ids, self._readers, self._batch = ids, readers, batch
        self.iteration = 0
        epoch, rest = divmod(start, plan.chunks_per_epoch)  # ``start`` counts ``plan``'s chunks
        skip = int(position["chunk"]) if position is not None else epoch * chunks + rest
        for _ in range(skip):  # DALI readers cannot seek: read and drop
            for _ in range(self._runs(self.iteration)):
                [p.run() for p in self._pipes]
            self.iteration += 1

    def _runs(self, iteration: int) -> int:
        """Reader runs in chunk ``iteration`` (fewer in an epoch's last chunk)."""
        c = iteration % self.plan.chunks_per_epoch
        return min(self._chunk_runs, self._epoch_runs - c * self._chunk_runs)

    def _build_reader(self, shard: int, readers: int, plan: Plan, batch: int, threads: int,
                      device_id: int | None, prefetch: int):
        from nvidia.dali import pipeline_def

        source, where, training = self.source, "gpu" if device_id is not None else "cpu", \
            self.training

        # DALI's pipeline_def stub types device_id as int; its docs take None (CPU only)
        @pipeline_def(batch_size=batch, num_threads=threads, device_id=device_id,  # type: ignore[arg-type]
                      seed=plan.seed, prefetch_queue_depth=prefetch)
        def pipeline():
            xy = source.read(shard_id=shard, num_shards=readers, shuffle=plan.shuffle,
                             device=where)
            return augmented(source, xy, training)

        pipe = pipeline()
        pipe.build()
        return pipe

    def _mask(self, shard_index: int, iteration: int) -> np.ndarray:
        epoch, c = divmod(iteration, self.plan.chunks_per_epoch)
        shard = self._ids[shard_index]
        if not self._stick:
            shard = (shard + epoch) % self._readers
        return c * self._batch + np.arange(self._batch) < self._sizes[shard]

    def _layout(self, a: Any) -> Any:
        """Reading order -> shard-major rows, so that padding lands in the last steps."""
        k, g = self.plan.steps_per_execution, self._group
        if g == 1 or k == 1:
            return a
        return a.reshape((k, g, -1) + a.shape[1:]).swapaxes(0, 1).reshape(a.shape)

    def _suspects(self, iteration: int) -> list[int]:
        return []

    def _chunk_of(self, pipe: Any, iteration: int, runs: int) -> tuple[Any, Any]:
        """A pipeline's rows of chunk ``iteration``: ``runs`` runs, then copies of the last one
        up to the chunk's size (masked: past the shard's end)."""
        outs = [self._run(pipe, iteration) for _ in range(runs)]
        return self._join(outs + [outs[-1]] * (self._chunk_runs - runs))

    def _produce(self, iteration: int) -> dict[str, jax.Array]:
        """Chunk ``iteration`` of the stream: the pipelines' next batches, with their masks."""
        runs = self._runs(iteration)
        outputs = [self._chunk_of(p, iteration, runs) for p in self._pipes]
        masks = [self._layout(self._mask(k, iteration)) for k in range(len(self._pipes))]
        if self._on_gpu:
            xs, ys = zip(*outputs, strict=True)
            x, y = self.placement.shard_device_rows(xs), self.placement.shard_device_rows(ys)
        else:
            x, y = (self.placement.shard_host_rows(np.concatenate([self._layout(o[j])
                                                                   for o in outputs]))
                    for j in (0, 1))
        return {"x": x, "y": y,
                "mask": self.placement.shard_host_rows(np.concatenate(masks))}


def scan_for_bad_record(source: ReaderSource, limit: int = 100_000) -> str | None:
    """Reads ``source`` in order, one record at a time, up to ``limit`` records; names the first
    one DALI cannot read or decode (``source.locate(position)``)."""
    from nvidia.dali import pipeline_def

    from .images import first_line

    # DALI's pipeline_def stub types device_id as int; its docs take None (CPU only)
    @pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1,  # type: ignore[call-overload]
                  exec_async=False, exec_pipelined=False)
    def pipeline():
        return source.read(shard_id=0, num_shards=1, shuffle=False, device="cpu")

    pipe = pipeline()
    try:
        pipe.build()
        for t in range(min(source.num_samples, limit)):
            try:
                pipe.run()
            except RuntimeError as e:
                return f"{source.locate(t)}: cannot be decoded or read ({first_line(e)})"
    except RuntimeError as e:
        return f"{source.describe()}: cannot be read ({first_line(e)})"
    finally:
        del pipe
    return None
