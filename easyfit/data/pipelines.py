"""The loader's two pipeline kinds: DALI pipelines that produce one chunk of global batches.

* :class:`FedPipelines`, for an :class:`~easyfit.data.sources.base.IndexedSource`: each pipeline
  is fed by an ``external_source`` whose callback asks the :class:`~easyfit.data.plan.Plan`
  which samples make up the chunk DALI is preparing. The order is a pure function of (seed,
  data pass), so a position is just a chunk index.
* :class:`~easyfit.data.reader_pipelines.ReaderPipelines` (in its own module), for a
  :class:`~easyfit.data.sources.base.ReaderSource`: DALI's reader
  picks the order, one shard per pipeline. A position holds DALI's own pipeline checkpoints
  (``enable_checkpointing``), from which the pipelines are rebuilt to go on exactly there.

On GPU machines, several pipelines per local GPU, each preparing a part of the device's rows;
they run on the GPU (``device_id``) only when the source decodes there, else on the host, and
the chunk is copied to the devices in one transfer. On a CPU-only machine, one pipeline.
A pipeline's share of a chunk is prepared in runs of at most :data:`RUN_ROWS` rows.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._env import available_cores
from ..errors import DataError
from ..parallel import Placement
from .augment import Augment
from .diagnose import batch_error, outside_error, turned_sample
from .plan import Orders, Plan
from .sources.base import IndexedSource, Source

__all__ = [
    "RUN_ROWS",
    "FedPipelines",
    "PipelineRunner",
    "default_num_threads",
    "on_gpu_pipelines",
    "run_rows",
    "shard_sizes",
]


def default_num_threads(platform: str, pipelines: int) -> int:
    """DALI worker threads per pipeline.

    On a CPU-only machine training itself needs the cores, so DALI gets half of them. On GPU
    machines each pipeline gets its share of the cores, capped at 8 (more does not help; see
    docs/performance.md).
    """
    cores = available_cores()
    if platform == "cpu":
        return max(1, cores // 2)
    return max(1, min(8, cores // max(1, pipelines)))


#: Most rows one pipeline run prepares: DALI's throughput falls steeply with larger batches
#: (docs/performance.md), so a pipeline's share of a chunk is prepared in several runs.
RUN_ROWS = 256


def run_rows(rows: int) -> int:
    """Rows of one run of a reader pipeline, which must split a chunk's ``rows`` evenly: their
    largest divisor up to :data:`RUN_ROWS`, or ``rows`` itself (one run) when that divisor is
    under ``RUN_ROWS // 8``, for which the runs would cost more than they save.

    Example:
        >>> from easyfit.data.pipelines import run_rows
        >>> run_rows(6000), run_rows(200), run_rows(514)
        (250, 200, 514)
    """
    best = max(d for d in range(1, min(rows, RUN_ROWS) + 1) if rows % d == 0)
    return best if best >= min(rows, RUN_ROWS // 8) else rows


def shard_sizes(num_samples: int, num_shards: int) -> np.ndarray:
    """Samples in each of DALI's shards: shard k is ``[k*n//s, (k+1)*n//s)``.

    Example:
        >>> from easyfit.data.pipelines import shard_sizes
        >>> shard_sizes(10, 3).tolist()
        [3, 3, 4]
    """
    bounds = np.arange(num_shards + 1, dtype=np.int64) * num_samples // num_shards
    return np.diff(bounds)


def on_gpu_pipelines(source: Source, placement: Placement) -> bool:
    """Whether the pipelines run on the GPUs (``device_id`` set, outputs in device memory).

    Only when the source runs operators there (``source.uses_gpu``: the GPU image decoder).
    Otherwise the pipelines run on the host and the chunk is copied to the devices in one
    transfer, which costs less than DALI's per-pipeline copies for small samples.
    """
    return placement.platform == "gpu" and source.uses_gpu


def augmented(source: Source, outputs: tuple[Any, ...], training: bool) -> tuple[Any, ...]:
    """The graph's outputs (``(x, y, ...)``) with a plain-function augmentation applied to
    ``x`` when training (an :class:`~easyfit.data.augment.Augment` is applied by the source's
    graph, with its draws)."""
    x, *rest = outputs
    if training and source.augment is not None and not isinstance(source.augment, Augment):
        x = source.augment(x)
    return (x, *rest)


def draws_of(source: Source, training: bool) -> Augment | None:
    """The source's Augment when its draws are wanted (training batches), else None."""
    return source.augment if training and isinstance(source.augment, Augment) else None


def pipeline_seed(seed: int, *key: int) -> int:
    """A DALI seed of its own for each pipeline (or reader shard), derived from the Trainer's
    seed: pipelines never repeat each other's random draws.

    Example:
        >>> from easyfit.data.pipelines import pipeline_seed
        >>> pipeline_seed(0, 0, 1) != pipeline_seed(0, 0, 2)
        True
    """
    return int(np.random.SeedSequence([seed, *key]).generate_state(1)[0] & 0x7FFFFFFF)


class PipelineRunner:
    """What both kinds do with one DALI pipeline run: outputs checked, converted and joined."""

    def __init__(self, source: Source, on_gpu: bool):
        self.source = source
        self.on_gpu = on_gpu

    def run(self, pipe: Any, suspects: Any) -> tuple[Any, ...]:
        """One run of ``pipe`` as ``(x, y)`` (or one array per name of ``source.outputs``); a
        failure becomes a DataError naming the bad sample among ``suspects()`` when one is found."""
        try:
            outs = pipe.run()
        except RuntimeError as e:
            raise batch_error(self.source, e, suspects()) from None
        names = self.source.outputs
        arrays = tuple(self.convert(pipe, o, name, suspects) for o, name in zip(outs, names, strict=True))
        limit = self.source.decoded_label_limit()
        if limit is not None and "y" in names and isinstance(self.source, IndexedSource):
            y = arrays[names.index("y")]
            if bool(((y < 0) | (y >= limit)).any()):  # one reduction per batch (on its device)
                raise outside_error(self.source, suspects(), limit, np.asarray(y)) from None
        return arrays

    def convert(self, pipe: Any, out: Any, name: str, suspects: Any = list) -> Any:
        if not out.is_dense_tensor():
            shapes = sorted({tuple(out[i].shape()) for i in range(len(out))})
            a, b = shapes[0], shapes[-1]
            why = ""
            if len(a) == 3 and (a[1], a[0], a[2]) == b:  # height and width swapped
                turned = isinstance(self.source, IndexedSource) and turned_sample(self.source, suspects())
                why = "height and width swapped: " + (
                    turned
                    or "a photo with an EXIF orientation that turns it by a quarter (DALI applies "
                    "it, as Pillow's exif_transpose does) is decoded turned"
                )
                why += ". "
            raise DataError(
                f"{self.source.describe()}: samples of {name} differ in shape ({a} and {b}); {why}"
                "For images pass image_size=(height, width) to resize them all"
            )
        if not self.on_gpu:
            return out.as_array()
        array = jax.dlpack.from_dlpack(out.as_tensor())
        return array if pipe.exec_dynamic else array.copy()

    def join(self, runs: list[tuple[Any, ...]]) -> tuple[Any, ...]:
        """The ``(x, y, ...)`` outputs of consecutive runs of one pipeline, as one."""
        if len(runs) == 1:
            return runs[0]
        concatenate = jnp.concatenate if self.on_gpu else np.concatenate
        return tuple(concatenate(parts) for parts in zip(*runs, strict=True))


# --------------------------------------------------------------------------- index-fed sources
class _Feeder:
    """The external_source callback of one pipeline: its rows of each chunk, prepared in
    ``len(parts)`` runs (run ``j`` feeds part ``j % len(parts)`` of chunk ``start + j // len(parts)``).
    """

    def __init__(
        self, source: IndexedSource, plan: Plan, rows: np.ndarray, start: int, augment: Augment | None
    ):
        self.source = source
        self.augment = augment
        self.plan = plan
        self.start = start
        self.rows = rows
        self.parts = np.array_split(rows, -(-len(rows) // RUN_ROWS))
        self._orders = Orders(plan)

    def chunk(self, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        return self.plan.chunk(iteration, self._orders)

    def __call__(self, info: Any) -> Any:
        chunk, part = divmod(info.iteration, len(self.parts))
        iteration = self.start + chunk
        idx, _ = self.chunk(iteration)
        rows = idx[self.parts[part]]
        fed = tuple(self.source.feed(rows))
        if self.augment is None:
            return fed
        passes = self.plan.passes(iteration)[self.parts[part]]
        draws: list[np.ndarray] = []
        for p in np.unique(passes):  # a sample's draws: a function of (seed, pass, index)
            these = passes == p
            got = self.augment.sample(self.plan.seed, int(p), rows[these])
            draws = draws or [np.empty((len(rows), *g.shape[1:]), g.dtype) for g in got]
            for out, g in zip(draws, got, strict=True):
                out[these] = g
        return fed + tuple(draws)


class FedPipelines:
    """Pipelines fed by easyfit's sampler (an :class:`IndexedSource`), starting at chunk
    ``start``. ``pool``: wait for and refeed each pipeline in its own thread."""

    def __init__(
        self,
        source: IndexedSource,
        plan: Plan,
        placement: Placement,
        *,
        start: int,
        num_threads: int | None,
        prefetch: int,
        pipelines_per_device: int | None,
        training: bool,
        pool: bool,
    ):
        self.source = source
        self.plan = plan
        self.placement = placement
        self.training = training
        self.prefetch = prefetch
        self.on_gpu = on_gpu_pipelines(source, placement)
        self._runner = PipelineRunner(source, self.on_gpu)
        local = placement.local_shards
        per = plan.rows_per_shard
        if placement.platform == "gpu":  # (rows, device) of each pipeline: part of a device's rows
            cores = available_cores() // len(local)
            parts = pipelines_per_device or (3 if cores >= 12 else 2 if cores >= 8 else 1)
            specs = [
                (rows, d if self.on_gpu else None)
                for s, d in local
                for rows in np.array_split(np.arange(s * per, (s + 1) * per), parts)
            ]
        else:  # host pipelines for all local rows (default one: training needs the cores)
            rows = np.concatenate([np.arange(s * per, (s + 1) * per) for s, _ in local])
            specs = [(part, None) for part in np.array_split(rows, pipelines_per_device or 1)]
        self._devices = [d for _, d in specs]
        threads = num_threads or default_num_threads(placement.platform, len(specs))
        augment = draws_of(source, training)
        self._feeders = [_Feeder(source, plan, rows, start, augment) for rows, _ in specs]
        self._pipes = [
            self._build(
                f,
                len(f.parts[0]),
                threads,
                d.local_hardware_id if d is not None else None,
                pipeline_seed(plan.seed, jax.process_index(), k),
            )
            for k, (f, (_, d)) in enumerate(zip(self._feeders, specs))
        ]
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(len(self._pipes), "easyfit-pipeline")
            if pool and len(self._pipes) > 1
            else None
        )

    def _build(self, feeder: _Feeder, batch: int, threads: int, device_id: int | None, seed: int) -> Any:
        from nvidia.dali import fn, pipeline_def

        source = self.source
        training = self.training
        where = "gpu" if device_id is not None else "cpu"
        names = feeder.augment.names() if feeder.augment is not None else []

        # DALI's pipeline_def stub types device_id as int; its docs take None (CPU only)
        @pipeline_def(
            batch_size=batch,
            num_threads=threads,
            device_id=device_id,  # type: ignore[arg-type]
            seed=seed,
            prefetch_queue_depth=self.prefetch,
        )
        def pipeline():
            nodes = fn.external_source(
                source=feeder, batch=True, batch_info=True, num_outputs=source.num_feeds + len(names)
            )
            nodes = list(nodes) if isinstance(nodes, (list, tuple)) else [nodes]
            fed, drawn = nodes[: source.num_feeds], nodes[source.num_feeds :]
            draws = {"draws": dict(zip(names, drawn, strict=True))} if names else {}
            return augmented(source, source.graph(*fed, device=where, **draws), training)

        pipe = pipeline()
        pipe.build()
        return pipe

    def position(self, iteration: int) -> dict[str, Any]:
        """The sample order is a pure function of (seed, data pass): a chunk index is enough."""
        return {"chunk": iteration}

    def produce(self, iteration: int) -> dict[str, jax.Array]:
        """Chunk ``iteration`` of the stream."""
        if self._pool is not None:
            outputs = list(self._pool.map(lambda i: self._share(i, iteration), range(len(self._pipes))))
        else:
            outputs = [self._share(i, iteration) for i in range(len(self._pipes))]
        _, mask = self._feeders[0].chunk(iteration)
        if self.on_gpu:  # each output (x, y, ...) sharded on its rows
            arrays = [self.placement.shard_device_rows(self._per_device(parts)) for parts in zip(*outputs)]
        else:  # host pipelines, in local row order: one copy of the whole chunk to the devices
            arrays = [
                self.placement.shard_host_rows(parts[0] if len(parts) == 1 else np.concatenate(parts))
                for parts in zip(*outputs)
            ]
        return {**self.source.assemble(arrays), "mask": self.placement.shard_global_rows(mask)}

    def _share(self, index: int, iteration: int) -> tuple[Any, ...]:
        """Pipeline ``index``'s rows of chunk ``iteration``: the outputs of its runs, joined."""
        pipe = self._pipes[index]
        count = len(self._feeders[index].parts)
        return self._runner.join(
            [self._runner.run(pipe, lambda: self._suspects(iteration)) for _ in range(count)]
        )

    def _suspects(self, iteration: int) -> list[int]:
        """The samples DALI may have been reading: this chunk's and those prefetched after it."""
        chunks = range(iteration, iteration + self.prefetch + 2)
        return [int(i) for c in chunks for i in self._feeders[0].chunk(c)[0]]

    def _per_device(self, arrays: tuple[jax.Array, ...]) -> list[jax.Array]:
        """One array per local device, joining the parts of its pipelines (in row order)."""
        joined: dict[Any, list[jax.Array]] = {}
        for device, array in zip(self._devices, arrays):
            joined.setdefault(device, []).append(array)
        return [parts[0] if len(parts) == 1 else jnp.concatenate(parts) for parts in joined.values()]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self._pipes.clear()
