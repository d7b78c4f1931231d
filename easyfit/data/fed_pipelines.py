"""The pipelines of an :class:`~easyfit.data.sources.base.IndexedSource`: each is fed by an
``external_source`` whose callback asks the :class:`~easyfit.data.plan.Plan` which samples make
up the chunk DALI is preparing. The order is a pure function of (seed, data pass), so a position
is just a chunk index.

On GPU machines, several pipelines per local GPU, each preparing a part of the device's rows; on a
CPU-only machine, one pipeline (or ``pipelines_per_device`` in all).
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from .._env import available_cores
from .augment import Augment
from .diagnose import find_bad_sample
from .pipelines import (
    RUN_ROWS,
    PipelineBuilder,
    PipelineRunner,
    default_num_threads,
    draws_of,
    pipeline_seed,
)
from .plan import Orders, Plan
from .sources.base import IndexedSource
from .stream import LoaderOptions, StreamRequest

__all__ = ["AHEAD", "FedPipelines"]

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
