"""The DALI pipelines that produce a stream's chunks, of both kinds of source, and what they
share.

* :class:`FedPipelines`, for an :class:`~easyfit.data.sources.base.IndexedSource`: each pipeline
  is fed by an ``external_source`` whose callback asks the :class:`~easyfit.data.plan.Plan`
  which samples make up the chunk DALI is preparing. The order is a pure function of (seed,
  data pass), so a position is just a chunk index. On GPU machines, several pipelines per local
  GPU, each preparing a part of the device's rows; on a CPU-only machine, one pipeline (or
  ``pipelines_per_device`` in all).
* :class:`ReaderPipelines`, for a :class:`~easyfit.data.sources.base.ReaderSource`: DALI's
  reader picks the order, one shard per pipeline. A position holds DALI's own pipeline
  checkpoints (``enable_checkpointing``), from which the pipelines are rebuilt to go on exactly
  there; they are serialised only when a position is read. The plan such a stream follows, and
  how its pipelines cut it, is :func:`reader_plan`'s, made when the stream is decided.

Both are built by a :class:`PipelineBuilder` and their runs checked and converted by a
:class:`PipelineRunner`. Which kind a source gets is decided once, in
:func:`~easyfit.data.loader.stream_request`. On GPU machines the pipelines run on the GPU
(``device_id``) only when the source decodes there, else on the host, and a chunk is copied to
the devices in one transfer. A pipeline's share of a chunk is prepared in runs of at most
:data:`RUN_ROWS` rows.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable, Iterable
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from .._env import available_cores
from ..errors import DataError
from ..parallel import Placement
from .augment import Augment
from .diagnose import (
    batch_error,
    find_bad_sample,
    odd_shape_sample,
    outside_error,
    scan_for_bad_record,
    turned_sample,
)
from .plan import Orders, Plan
from .sources.base import READER, IndexedSource, ReaderSource, Source
from .sources.capabilities import DecodedLabels
from .stream import LoaderOptions, StreamRequest

__all__ = [
    "AHEAD",
    "RUN_ROWS",
    "FedPipelines",
    "PipelineBuilder",
    "PipelineRunner",
    "ReaderLayout",
    "ReaderPipelines",
    "ReaderPlan",
    "default_num_threads",
    "on_gpu_pipelines",
    "reader_plan",
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


@dataclasses.dataclass(frozen=True)
class PipelineBuilder:
    """What every DALI pipeline of one stream is built with, and the building.

    Args:
        source: what the pipelines read.
        training: whether a plain-function augmentation applies (:func:`augmented`).
        threads: DALI worker threads per pipeline.
        prefetch: DALI's prefetch queue depth.
        checkpointing: whether DALI keeps the pipelines' checkpoints (reader pipelines).
    """

    source: Source
    training: bool
    threads: int
    prefetch: int
    checkpointing: bool = False

    def build(
        self,
        graph: Callable[[str], tuple[Any, ...]],
        *,
        batch: int,
        device_id: int | None,
        seed: int,
        checkpoint: bytes | None = None,
    ) -> Any:
        """A pipeline of ``batch`` samples a run, built, whose outputs are ``graph(device)``'s
        (``device``: ``"gpu"`` with a ``device_id``, else ``"cpu"``), augmented when training;
        ``checkpoint``, one of DALI's pipeline checkpoints, says where it starts."""
        from nvidia.dali import pipeline_def

        source, training = self.source, self.training
        where = "gpu" if device_id is not None else "cpu"

        # DALI's pipeline_def stub types device_id as int; its docs take None (CPU only)
        @pipeline_def(
            batch_size=batch,
            num_threads=self.threads,
            device_id=device_id,  # type: ignore[arg-type]
            seed=seed,
            prefetch_queue_depth=self.prefetch,
            enable_checkpointing=self.checkpointing,
        )
        def pipeline():
            return augmented(source, graph(where), training)

        pipe = pipeline(checkpoint=checkpoint) if checkpoint is not None else pipeline()
        pipe.build()
        return pipe


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
    """What both kinds do with one DALI pipeline run: outputs checked, converted and joined.

    Args:
        source: what the pipelines read.
        placement: the devices; the pipelines run on the GPUs when :func:`on_gpu_pipelines`
            says so (:attr:`on_gpu`: their outputs are then in device memory).
        find: names the bad sample of a failed run among the suspects the run gives (None
            when none is found).
        indexed: the suspects are sample indices of an
            :class:`~easyfit.data.sources.base.IndexedSource` (given by its pipelines): decoded
            labels and turned images are then traced back to their samples.
    """

    def __init__(
        self,
        source: Source,
        placement: Placement,
        find: Callable[[Iterable[int]], str | None],
        indexed: IndexedSource | None = None,
    ):
        self.source = source
        self.on_gpu = on_gpu_pipelines(source, placement)
        self._find = find
        self._indexed = indexed
        self._shapes: dict[str, tuple[int, ...]] = {}  # one sample's of each output, first run's

    def run(self, pipe: Any, suspects: Any) -> tuple[Any, ...]:
        """One run of ``pipe`` as ``(x, y)`` (or one array per name of ``source.outputs``); a
        failure becomes a DataError naming the bad sample among ``suspects()`` when one is found."""
        try:
            outs = pipe.run()
        except RuntimeError as e:
            raise batch_error(self.source, e, self._find(suspects())) from None
        names = self.source.outputs
        arrays = tuple(self.convert(pipe, o, name, suspects) for o, name in zip(outs, names, strict=True))
        for name, a in zip(names, arrays, strict=True):  # shapes only: nothing is computed
            usual = self._shapes.setdefault(name, tuple(a.shape[1:]))
            if tuple(a.shape[1:]) != usual:  # the steps were traced for the usual shape
                raise self._differ(name, usual, tuple(a.shape[1:]), suspects)
        limit = self.source.decoded_label_limit() if isinstance(self.source, DecodedLabels) else None
        if limit is not None and "y" in names and self._indexed is not None:
            y = arrays[names.index("y")]
            if bool(((y < 0) | (y >= limit)).any()):  # one reduction per batch (on its device)
                raise outside_error(self._indexed, suspects(), limit, np.asarray(y)) from None
        return arrays

    def convert(self, pipe: Any, out: Any, name: str, suspects: Any = list) -> Any:
        if not out.is_dense_tensor():
            shapes = [tuple(int(d) for d in out[i].shape()) for i in range(len(out))]
            usual = self._shapes.get(name) or max(shapes, key=shapes.count)  # earlier runs', or most
            raise self._differ(name, usual, next(s for s in shapes if s != usual), suspects)
        if not self.on_gpu:
            return out.as_array()
        array = jax.dlpack.from_dlpack(out.as_tensor())
        return array if pipe.exec_dynamic else array.copy()

    def _differ(self, name: str, a: tuple[int, ...], b: tuple[int, ...], suspects: Any) -> DataError:
        """The DataError for samples of output ``name`` of shape ``b`` where ``a`` was usual,
        naming the sample among ``suspects()`` that is decoded to another shape when one is."""
        why, turned, odd = "", None, None
        if len(a) == 3 and (a[1], a[0], a[2]) == b:  # height and width swapped
            turned = self._indexed is not None and turned_sample(self._indexed, suspects())
            why = "height and width swapped: " + (
                turned
                or "a photo with an EXIF orientation that turns it by a quarter (DALI applies "
                "it, as Pillow's exif_transpose does) is decoded turned"
            )
            why += ". "
        if not turned and self._indexed is not None:
            odd = odd_shape_sample(self._indexed, suspects(), self.source.outputs.index(name), a)
        return DataError(
            f"{self.source.describe()}: samples of {name} differ in shape ({a} and {b})"
            + (f": {odd}, not {a} as the others" if odd else "")
            + f"; {why}For images resize them all: ef.data.ImageFolder(path, image_size=(h, w)) (or "
            "the image_size= of the source you use)"
        )

    def join(self, runs: list[tuple[Any, ...]]) -> tuple[Any, ...]:
        """The ``(x, y, ...)`` outputs of consecutive runs of one pipeline, as one."""
        if len(runs) == 1:
            return runs[0]
        concatenate = jnp.concatenate if self.on_gpu else np.concatenate
        return tuple(concatenate(parts) for parts in zip(*runs, strict=True))


#: Runs after the one being fed whose samples the source is told of (``IndexedSource.prepare``:
#: a streamed folder checks their files in child processes meanwhile).
AHEAD = 4


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
        self._chunks: dict[int, np.ndarray] = {}  # the indices of the latest chunks

    def chunk(self, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        return self.plan.chunk(iteration, self._orders)

    def _rows(self, run: int) -> tuple[int, int, np.ndarray]:
        """``(chunk iteration, part, sample indices)`` of run ``run``."""
        chunk, part = divmod(run, len(self.parts))
        iteration = self.start + chunk
        idx = self._chunks.get(iteration)
        if idx is None:
            idx = self._chunks[iteration] = self.chunk(iteration)[0]
            for old in [c for c in self._chunks if c < iteration - 1]:
                del self._chunks[old]
        return iteration, part, idx[self.parts[part]]

    def __call__(self, info: Any) -> Any:
        iteration, part, rows = self._rows(info.iteration)
        fed = tuple(self.source.feed(rows))
        runs = range(info.iteration + 1, info.iteration + 1 + AHEAD)  # checked while these run
        self.source.prepare(np.concatenate([self._rows(r)[2] for r in runs]))
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


def _samples(outputs: tuple[Any, ...]) -> list[tuple[tuple[int, ...], np.dtype]]:
    """One sample's shape and dtype of each output of a pipeline run."""
    return [(tuple(int(d) for d in a.shape[1:]), np.dtype(a.dtype)) for a in outputs]


def _shown(samples: list[tuple[tuple[int, ...], np.dtype]]) -> str:
    return ", ".join(f"{shape} {dtype}" for shape, dtype in samples)


class FedPipelines:
    """Pipelines fed by easyfit's sampler (an :class:`IndexedSource`), as ``request`` asks (its
    source, plan and placement, from its first chunk, augmented when training), run with
    ``options``. ``pool``: wait for and refeed each pipeline in its own thread."""

    def __init__(self, request: StreamRequest, options: LoaderOptions, *, pool: bool):
        source = cast(IndexedSource, request.source)
        plan, placement, start = request.plan, request.placement, request.start
        num_threads, pipelines_per_device = options.num_threads, options.pipelines_per_device
        self.source = source
        self.plan = plan
        self.placement = placement
        self.training = training = request.training
        self.prefetch = options.prefetch
        self._runner = PipelineRunner(
            source, placement, lambda suspects: find_bad_sample(source, suspects), indexed=source
        )
        self.on_gpu = self._runner.on_gpu
        local = placement.local_shards
        per = plan.rows_per_shard
        if placement.platform == "gpu":  # (rows, device) of each pipeline: part of a device's rows
            cores = available_cores() // len(local)
            parts = pipelines_per_device or (3 if cores >= 12 else 2 if cores >= 8 else 1)
            rows_and_devices = [
                (rows, d if self.on_gpu else None)
                for s, d in local
                for rows in np.array_split(np.arange(s * per, (s + 1) * per), parts)
            ]
        else:  # host pipelines for all local rows (default one: training needs the cores)
            rows = np.concatenate([np.arange(s * per, (s + 1) * per) for s, _ in local])
            rows_and_devices = [(part, None) for part in np.array_split(rows, pipelines_per_device or 1)]
        self._devices = [d for _, d in rows_and_devices]
        threads = num_threads or default_num_threads(placement.platform, len(rows_and_devices))
        augment = draws_of(source, training)
        self._feeders = [_Feeder(source, plan, rows, start, augment) for rows, _ in rows_and_devices]
        self._builder = PipelineBuilder(source, training, threads, self.prefetch)
        self._pipes: list[Any] = []  # built by the first chunk's production (:meth:`_built`)
        self._closed = False
        declared = source.output_spec()
        self._declared = None if declared is None else [(tuple(s), np.dtype(d)) for s, d in declared]
        self._first_run: tuple[Any, ...] | None = None  # pipeline 0's first outputs
        self._first_ran = threading.Event()  # set then, or when the first chunk failed
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(len(rows_and_devices), "easyfit-pipeline")
            if pool and len(rows_and_devices) > 1
            else None
        )

    def _built(self) -> list[Any]:
        """The pipelines, built when the first chunk is produced rather than when the stream
        opens: on a GPU that is in the loader's thread, where a build (seconds: DALI's decoders
        probe the hardware) runs while the model initialises and its first step compiles."""
        if self._closed:
            raise RuntimeError(f"{self.source.describe()}: its pipelines were closed")
        if not self._pipes:
            self._pipes = [
                self._build(
                    f,
                    len(f.parts[0]),
                    d.local_hardware_id if d is not None else None,
                    pipeline_seed(self.plan.seed, jax.process_index(), k),
                )
                for k, (f, d) in enumerate(zip(self._feeders, self._devices, strict=True))
            ]
        return self._pipes

    def _build(self, feeder: _Feeder, batch: int, device_id: int | None, seed: int) -> Any:
        from nvidia.dali import fn

        source = self.source
        names = feeder.augment.names() if feeder.augment is not None else []

        def graph(where):  # DALI's operators, called inside the pipeline's definition
            nodes = fn.external_source(
                source=feeder,
                batch=True,
                batch_info=True,
                num_outputs=source.num_feeds + len(names),
                no_copy=source.feeds_shared,
            )
            nodes = list(nodes) if isinstance(nodes, (list, tuple)) else [nodes]
            fed, drawn = nodes[: source.num_feeds], nodes[source.num_feeds :]
            draws = {"draws": dict(zip(names, drawn, strict=True))} if names else {}
            return source.graph(*fed, device=where, **draws)

        return self._builder.build(graph, batch=batch, device_id=device_id, seed=seed)

    def position(self, iteration: int) -> dict[str, Any]:
        """The sample order is a pure function of (seed, data pass): a chunk index is enough."""
        return {"chunk": iteration}

    def produce(self, iteration: int, peek: bool = False) -> dict[str, jax.Array]:
        """Chunk ``iteration`` of the stream (``peek``: nothing to keep, any chunk can be
        produced again from the plan)."""
        try:
            count = len(self._built())
            if self._pool is not None:
                outputs = list(self._pool.map(lambda i: self._share(i, iteration), range(count)))
            else:
                outputs = [self._share(i, iteration) for i in range(count)]
        finally:
            self._first_ran.set()  # a chunk failed: chunk_spec waits no more
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
        runs = []
        for _ in range(len(self._feeders[index].parts)):
            runs.append(self._runner.run(pipe, lambda: self._suspects(iteration)))
            if index == 0 and not self._first_ran.is_set():
                self._first_run = runs[0]
                self._first_ran.set()
                self._check_declared(runs[0])
        return self._runner.join(runs)

    def chunk_spec(self) -> dict[str, Any] | None:
        """The chunks' ``jax.ShapeDtypeStruct`` leaves (shapes, dtypes, shardings): from the
        source's :meth:`~easyfit.data.sources.base.Source.output_spec` when it declares one (no
        wait; the first run is checked against it), else from the first run of the first
        pipeline (each run's rows are those of every other: one sample's shape and dtype per
        output), waiting for that run. None when it failed."""
        samples = self._declared
        if samples is None:
            self._first_ran.wait()
            first_run = self._first_run
            if first_run is None:
                return None
            samples = _samples(first_run)
        rows = self.plan.rows_per_shard * self.placement.num_shards
        data = self.placement.data

        def shape_struct(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
            return jax.ShapeDtypeStruct((rows, *shape), dtype, sharding=data)

        _, mask = self._feeders[0].chunk(self._feeders[0].start)
        outputs = [shape_struct(shape, dtype) for shape, dtype in samples]
        return {**self.source.assemble(outputs), "mask": shape_struct(tuple(mask.shape[1:]), mask.dtype)}

    def _check_declared(self, outputs: tuple[Any, ...]) -> None:
        """Raises when the first run's outputs are not what the source declared (the model was
        initialised and the first step traced for those)."""
        if self._declared is not None and _samples(outputs) != self._declared:
            raise RuntimeError(
                f"{self.source.describe()}: the pipelines' outputs {_shown(_samples(outputs))} are not "
                f"the {_shown(self._declared)} its output_spec() declares (an easyfit bug: please "
                "report it)"
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
        self._closed = True
        self._pipes.clear()


@dataclasses.dataclass(frozen=True)
class ReaderLayout:
    """How the reader pipelines of a placement cut the stream: pipelines per process, readers
    in all, rows of a unit and of a run, and the runs of one reader pass."""

    per_process: int
    readers: int
    unit_steps: int
    unit: int
    run: int
    pass_runs: int

    @property
    def unit_runs(self) -> int:
        return self.unit // self.run

    @property
    def pass_units(self) -> int:
        return -(-self.pass_runs // self.unit_runs)


@dataclasses.dataclass(frozen=True)
class ReaderPlan(Plan):
    """A Plan whose pass is the padded shard length of a reader: ``pass_steps`` steps; and how
    the reader pipelines cut its stream (``layout``), worked out with it, once."""

    pass_steps: int = 1
    layout: ReaderLayout | None = dataclasses.field(default=None, repr=False)

    @property
    def steps_per_pass(self) -> int:
        return self.pass_steps


def _layout(plan: Plan, placement: Placement, pipelines: int | None) -> ReaderLayout:
    local = placement.local_shards
    per_process = len(local) if placement.platform == "gpu" else (pipelines or 1)
    if len(local) % per_process:
        raise ValueError(f"pipelines={pipelines}: must divide the {len(local)} local devices")
    readers = per_process * jax.process_count()
    batch = len(local) // per_process * plan.rows_per_shard  # a pipeline's rows of each chunk
    # a unit of the stream: a chunk, or a step when epochs may end between steps
    unit_steps = plan.steps_per_execution if plan.epoch_steps is None else 1
    unit = batch * unit_steps // plan.steps_per_execution
    run = run_rows(unit)  # read in runs of at most RUN_ROWS rows
    # DALI pads each shard to the longest one (pad_last_batch): ceil(n / readers) rows
    shard = -(-plan.num_samples // readers)
    return ReaderLayout(per_process, readers, unit_steps, unit, run, -(-shard // run))


def reader_plan(plan: Plan, placement: Placement, pipelines: int | None = None) -> ReaderPlan:
    """The plan a :class:`ReaderSource`'s stream follows on ``placement``: ``plan`` with the
    length of the reader's pass, each shard padded to whole units, and the layout of its
    pipelines (``pipelines``: per process on CPUs); ``plan`` itself when it is that already.

    Example:
        >>> import easyfit as ef
        >>> from easyfit.data.pipelines import reader_plan
        >>> placement = ef.parallel.Placement.create()
        >>> plan = reader_plan(ef.data.Plan(100, 32), placement)
        >>> plan.steps_per_pass, reader_plan(plan, placement) is plan
        (4, True)
    """
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan)}
    layout = _layout(plan, placement, pipelines)
    made = ReaderPlan(**fields, pass_steps=layout.pass_units * layout.unit_steps, layout=layout)
    return plan if made == plan and isinstance(plan, ReaderPlan) else made


class ReaderPipelines:
    """Pipelines of a :class:`ReaderSource`: one per local GPU (reader shard = the device's
    shard), or on CPUs ``pipelines`` per process (default 1), each reading one shard for an equal
    share of the local devices. :attr:`plan` is the request's, made by :func:`reader_plan` for
    this placement, with the layout the pipelines are built to.

    The reader's stream is read in *units* of whole runs: a chunk each, or with
    ``plan.epoch_steps`` (fit's ``steps_per_epoch``) a step each, so that an epoch can end
    between two steps of a reader pass and the next epoch go on from there. A reader pass is
    padded to whole units (the padding masked).

    Resume: a ``position`` from :meth:`position` holds each pipeline's DALI checkpoint
    (``Pipeline.checkpoint()``), and the pipelines are rebuilt from them (``checkpoint=``): the
    reader goes on exactly where it was, shuffle buffer included, reading nothing twice. Without
    one (``fit(initial_epoch=...)`` with no backup, or a position of only ``{"chunk": i}``), the
    chunks before are read and dropped, since DALI's readers cannot seek.
    """

    def __init__(self, request: StreamRequest, options: LoaderOptions):
        source = cast(ReaderSource, request.source)
        placement = request.placement
        position = request.position
        if not isinstance(request.plan, ReaderPlan) or request.plan.layout is None:
            raise TypeError("ReaderPipelines: the request's plan must be made by reader_plan")
        self.plan = request.plan
        layout = request.plan.layout
        self.source = source
        self.placement = placement
        self.training = request.training
        self._runner = PipelineRunner(source, placement, lambda _: scan_for_bad_record(source))
        self.on_gpu = self._runner.on_gpu
        local = placement.local_shards
        per_process, readers = layout.per_process, layout.readers
        size = len(local) // per_process
        groups = [list(range(k * size, (k + 1) * size)) for k in range(per_process)]
        ids = [jax.process_index() * per_process + k for k in range(per_process)]
        threads = options.num_threads or default_num_threads(placement.platform, len(groups))
        self._builder = PipelineBuilder(source, self.training, threads, options.prefetch, checkpointing=True)
        self._group = size
        self._unit_steps = layout.unit_steps
        self._unit = layout.unit
        saved = list((position or {}).get("dali") or [])
        # the reader's order depends on its number of shards: a position of another number
        # means other samples (a position of several processes holds no DALI checkpoints)
        was = (position or {}).get("readers", len(saved) * jax.process_count() if saved else readers)
        if was != readers:
            raise ValueError(
                f"position: saved for {was} reader pipelines, but this "
                f"placement has {readers}; {source.describe()} cannot resume "
                "exactly on another number of pipelines"
            )
        self._pipes = [
            self._build(
                shard,
                readers,
                self.plan,
                layout.run,
                local[g[0]][1].local_hardware_id if self.on_gpu else None,
                base64.b64decode(saved[k]) if saved else None,
            )
            for k, (shard, g) in enumerate(zip(ids, groups, strict=True))
        ]
        meta = self._pipes[0].reader_meta(READER)
        padded = readers * -(-self.plan.num_samples // readers)
        if meta["epoch_size"] != self.plan.num_samples or meta["epoch_size_padded"] != padded:
            self.close()
            raise DataError(
                f"{source.describe()}: its DALI reader counts {meta['epoch_size']} samples "
                f"({meta['epoch_size_padded']} padded), not {self.plan.num_samples} ({padded})"
            )
        # each shard, padded to whole runs; a unit holds unit // run of them, a pass's last unit
        # fewer (its other rows are masked copies)
        self._pass_runs = layout.pass_runs
        self._unit_runs = layout.unit_runs
        self._pass_units = layout.pass_units
        self._sizes = shard_sizes(meta["epoch_size"], readers)
        self._starts = np.concatenate([[0], np.cumsum(self._sizes)])
        #: Samples in one pass, as the reader counts them.
        self.num_samples = int(meta["epoch_size"])
        self._stick = bool(meta["stick_to_shard"])
        self._ids = ids
        self._readers = readers
        self._checkpoints: dict[int, list[str]] = {}  # before a peeked chunk, while unconsumed
        if saved:
            self.next = request.start
            return
        self.next = 0
        for _ in range(request.start):  # no checkpoint to resume from: read and drop
            for unit in self._units(self.next):
                for _ in range(self._runs(unit)):
                    for p in self._pipes:
                        p.run()
            self.next += 1

    def _build(
        self,
        shard: int,
        readers: int,
        plan: Plan,
        batch: int,
        device_id: int | None,
        checkpoint: bytes | None,
    ) -> Any:
        source = self.source
        augment = draws_of(source, self.training)

        def graph(where):  # DALI's operators, called inside the pipeline's definition
            draws = {"draws": augment.dali_draws()} if augment is not None else {}
            return source.read(
                shard_id=shard, num_shards=readers, shuffle=plan.shuffle, device=where, **draws
            )

        seed = pipeline_seed(plan.seed, shard)
        return self._builder.build(graph, batch=batch, device_id=device_id, seed=seed, checkpoint=checkpoint)

    def position(self, iteration: int) -> dict[str, Any]:
        """``{"chunk": i, "readers": r, "dali": [one checkpoint per pipeline]}``: the pipelines'
        state before chunk ``iteration``, the next one to be consumed (DALI's serialized
        checkpoints, base64 text so that the position stays JSON), and the number of reader
        shards, on which the order depends. With several processes no ``"dali"``: a
        checkpoint's metadata is written by process 0, whose pipelines read other shards than
        the others' (they resume by reading and dropping)."""
        if jax.process_count() > 1:
            return {"chunk": iteration, "readers": self._readers}
        if iteration == self.next:
            dali = self._checkpoint()
        elif iteration in self._checkpoints:
            dali = self._checkpoints[iteration]  # produced ahead (peeked), not yet consumed
        else:
            raise RuntimeError(f"reader pipelines are at chunk {self.next}: chunk {iteration}'s is gone")
        return {"chunk": iteration, "readers": self._readers, "dali": dali}

    def _checkpoint(self) -> list[str]:
        return [base64.b64encode(p.checkpoint()).decode("ascii") for p in self._pipes]

    def _units(self, iteration: int) -> list[int | None]:
        """The stream's units in chunk ``iteration``: their indices, None for the steps past
        the epoch's end (not read)."""
        steps, live = self.plan.steps(iteration)
        g = self._unit_steps
        return [int(s) // g if ok else None for s, ok in zip(steps[::g], live[::g], strict=True)]

    def _runs(self, unit: int | None) -> int:
        """Reader runs in a unit (fewer in a pass's last unit, none past the epoch's end)."""
        if unit is None:
            return 0
        return min(self._unit_runs, self._pass_runs - unit % self._pass_units * self._unit_runs)

    def _rows(self, shard_index: int, unit: int | None) -> tuple[int, np.ndarray, np.ndarray]:
        """The shard a pipeline reads in ``unit``, its rows' places in it, and which rows are
        samples (not the shard's padding, nor past the epoch's end)."""
        shard = self._ids[shard_index]
        if unit is None:
            return shard, np.zeros(self._unit, np.int64), np.zeros(self._unit, bool)
        data_pass, j = divmod(unit, self._pass_units)
        if not self._stick:
            shard = (shard + data_pass) % self._readers
        rows = j * self._unit + np.arange(self._unit)
        return shard, rows, rows < self._sizes[shard]

    def _mask(self, shard_index: int, iteration: int) -> np.ndarray:
        return np.concatenate([self._rows(shard_index, u)[2] for u in self._units(iteration)])

    def slots(self, iteration: int) -> jax.Array:
        """Each row's sample in the reader's unshuffled order (shard ``k`` holds the samples
        from ``k * n // shards`` on, in order), ``n`` for padding: laid out as
        :meth:`produce`'s rows. Only meaningful when the plan does not shuffle: then the row
        read as ``slots(i)[j]`` is the record at that place in the source's own order (an
        LMDB's key order), whatever the number of pipelines (``easyfit.data.cache.OrderedRead``)."""
        n = self.num_samples
        parts = []
        for k in range(len(self._pipes)):
            rows = [self._rows(k, u) for u in self._units(iteration)]
            placed = [np.where(valid, self._starts[shard] + r, n) for shard, r, valid in rows]
            parts.append(self._layout(np.concatenate(placed)))
        return self.placement.shard_host_rows(np.concatenate(parts).astype(np.int32))

    def _layout(self, a: Any) -> Any:
        """Reading order -> shard-major rows, so that padding lands in the last steps."""
        k = self.plan.steps_per_execution
        g = self._group
        if g == 1 or k == 1:
            return a
        return a.reshape((k, g, -1) + a.shape[1:]).swapaxes(0, 1).reshape(a.shape)

    def _chunk_of(self, pipe: Any, units: list[int | None]) -> tuple[Any, Any]:
        """A pipeline's rows of a chunk: each unit's runs, then copies of the last one up to the
        unit's size (masked: past the shard's end, or past the epoch's)."""
        outs: list[tuple[Any, Any]] = []
        for unit in units:
            runs = self._runs(unit)
            got = [self._runner.run(pipe, list) for _ in range(runs)]
            outs += got + [(got or outs)[-1]] * (self._unit_runs - runs)
        return self._runner.join(outs)

    def produce(self, iteration: int, peek: bool = False) -> dict[str, jax.Array]:
        """Chunk ``iteration`` of the stream: the pipelines' next runs, with their masks.
        ``peek``: the chunk is not consumed yet, so the pipelines' state before it is kept for
        :meth:`position`."""
        if iteration != self.next:
            raise RuntimeError(f"reader pipelines are at chunk {self.next}, not {iteration}")
        self.source.check_unchanged()  # its files as the source read them at start-up, or refused
        self._checkpoints = {iteration: self._checkpoint()} if peek and jax.process_count() == 1 else {}
        units = self._units(iteration)
        outputs = [self._chunk_of(p, units) for p in self._pipes]
        self.next += 1
        masks = [self._layout(self._mask(k, iteration)) for k in range(len(self._pipes))]
        if self.on_gpu:
            xs, ys = zip(*outputs, strict=True)
            x = self.placement.shard_device_rows(xs)
            y = self.placement.shard_device_rows(ys)
        else:
            x, y = (
                self.placement.shard_host_rows(np.concatenate([self._layout(o[j]) for o in outputs]))
                for j in (0, 1)
            )
        return {"x": x, "y": y, "mask": self.placement.shard_host_rows(np.concatenate(masks))}

    def close(self) -> None:
        self._pipes.clear()
        self._checkpoints.clear()
