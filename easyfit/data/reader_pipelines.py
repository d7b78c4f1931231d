"""The pipelines of a :class:`~easyfit.data.sources.base.ReaderSource`: DALI's reader picks the
order, one shard per pipeline. A position holds DALI's own pipeline checkpoints
(``enable_checkpointing``), from which the pipelines are rebuilt to go on exactly there; they are
serialised only when a position is read. What both pipeline kinds share is in
:mod:`easyfit.data.pipelines`.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any, cast

import jax
import numpy as np

from ..errors import DataError
from ..parallel import Placement
from .diagnose import scan_for_bad_record
from .pipelines import (
    PipelineBuilder,
    PipelineRunner,
    default_num_threads,
    draws_of,
    pipeline_seed,
    run_rows,
    shard_sizes,
)
from .plan import Plan
from .sources.base import READER, ReaderSource
from .stream import LoaderOptions, StreamRequest

__all__ = ["ReaderPipelines", "ReaderPlan", "reader_plan"]


@dataclasses.dataclass(frozen=True)
class ReaderPlan(Plan):
    """A Plan whose pass is the padded shard length of a reader: ``pass_steps`` steps."""

    pass_steps: int = 1

    @property
    def steps_per_pass(self) -> int:
        return self.pass_steps


@dataclasses.dataclass(frozen=True)
class _Layout:
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


def _layout(plan: Plan, placement: Placement, pipelines: int | None) -> _Layout:
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
    return _Layout(per_process, readers, unit_steps, unit, run, -(-shard // run))


def reader_plan(plan: Plan, placement: Placement, pipelines: int | None = None) -> ReaderPlan:
    """The plan a :class:`ReaderSource`'s stream follows on ``placement``: ``plan`` with the
    length of the reader's pass, each shard padded to whole units (``plan`` itself when it is
    that already).

    Example:
        >>> import easyfit as ef
        >>> from easyfit.data.reader_pipelines import reader_plan
        >>> placement = ef.parallel.Placement.create()
        >>> plan = reader_plan(ef.data.Plan(100, 32), placement)
        >>> plan.steps_per_pass, reader_plan(plan, placement) is plan
        (4, True)
    """
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan)}
    layout = _layout(plan, placement, pipelines)
    made = ReaderPlan(**fields, pass_steps=layout.pass_units * layout.unit_steps)
    return plan if made == plan and isinstance(plan, ReaderPlan) else made


class ReaderPipelines:
    """Pipelines of a :class:`ReaderSource`: one per local GPU (reader shard = the device's
    shard), or on CPUs ``pipelines`` per process (default 1), each reading one shard for an equal
    share of the local devices. :attr:`plan` is the request's, made by :func:`reader_plan` for
    this placement and ``options.pipelines``.

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
        if not isinstance(request.plan, ReaderPlan):
            raise TypeError("ReaderPipelines: the request's plan must be made by reader_plan")
        self.plan = request.plan
        layout = _layout(self.plan, placement, options.pipelines)
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
