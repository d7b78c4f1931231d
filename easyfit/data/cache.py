"""The device cache: decode once with DALI, then shuffle and batch on the device.

The decoded samples are kept on every device, one array per output (per array of structured
``x`` and ``y``, and the sample weights), in the source's order. Each later chunk is a gather of
the indices the :class:`~easyfit.data.plan.Plan` gives, so the same samples come in the same
steps as when streaming, and no input pipeline runs. The cache is filled one of two ways,
chosen by the source's kind when its stream is decided (:func:`~easyfit.data.loader.stream_request`):

* :class:`Recording`, for sources fed in the plan's order: the chunks decoded while training
  are also kept until every sample has been seen. Memory grows block by block as the recording
  goes, so nothing the size of the dataset is allocated before the first step.
* :class:`OrderedRead`, for sources read by DALI's own reader (which picks its order and cannot
  seek): before the first chunk, the reader pipelines read the dataset once, in order. Recording
  the reader's shuffled first epoch instead could not fill the cache of a fit resumed inside that
  epoch, and would make the first epoch depend on the number of pipelines.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ..parallel import DATA_AXIS, Placement
from .plan import Orders, Plan

if TYPE_CHECKING:
    from .stream import Stream

__all__ = [
    "DeviceCache",
    "OneRead",
    "OrderedRead",
    "Recording",
    "cache_budget",
    "chunk_buffers",
    "chunks_to_cover",
    "gather_rows",
    "record_chunk",
]

log = logging.getLogger("easyfit")

#: Fraction of one device's memory (host memory on a CPU-only machine) the cache may take.
CACHE_FRACTION = 0.4

#: Bytes of one block of a recording (at least one chunk): the recording grows by a block when a
#: chunk reaches past the last one, so that before the first step it holds one block, not the
#: whole dataset.
BLOCK_BYTES = 1 << 26


def cache_budget(placement: Placement) -> int:
    """Bytes the cache may take on each device."""
    stats = placement.local_shards[0][1].memory_stats() or {}
    if "bytes_limit" in stats:
        return int(CACHE_FRACTION * (stats["bytes_limit"] - stats.get("bytes_in_use", 0)))
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    # CPU devices share the host's memory: each holds a replica.
    return int(CACHE_FRACTION * host / max(1, len(placement.local_shards)))


class _Fill(Protocol):
    """One way to fill a :class:`DeviceCache`."""

    #: What the cache's position adds to ``{"chunk": i}``.
    mark: dict[str, Any]

    @property
    def warmup_epochs(self) -> int:
        """Epochs before input comes as in every later one."""
        ...

    @property
    def waited(self) -> float:
        """Seconds the consumer waited for the fill."""
        ...

    def step(self, cache: DeviceCache, peek: bool) -> dict[str, jax.Array] | None:
        """Chunk ``cache.iteration`` while filling (the cache then goes on), or None once the
        cache is filled (and gathers it)."""
        ...

    def close(self) -> None: ...


class DeviceCache:
    """Chunks gathered from device memory once ``fill`` has filled it.

    Args:
        plan: the batching plan.
        placement: the devices.
        fill: how the cache is filled (:class:`Recording` or :class:`OrderedRead`).
        start: index of the first chunk.
    """

    def __init__(self, plan: Plan, placement: Placement, fill: _Fill, *, start: int = 0):
        self.plan = plan
        self.placement = placement
        self.iteration = start
        self.orders = Orders(plan)
        self._fill = fill
        self._data: Any = None
        self._recorded: list[Any] = []  # blocks of chunks, as many as the recording has reached
        self._block = 0  # chunks per block, fixed by the first chunk
        self._rows = 0  # rows per chunk
        self._specs: Any = None  # the blocks' static arguments of chunk_buffers
        self._gather = jax.jit(gather_rows, out_shardings=placement.data)
        # chunk rows stay on their devices: (chunks, rows, ...) sharded on the rows
        sharding = NamedSharding(placement.mesh, P(None, DATA_AXIS))
        self._record = jax.jit(record_chunk, donate_argnums=(0,), out_shardings=sharding)
        self._allocate = jax.jit(chunk_buffers, static_argnums=(0, 1), out_shardings=sharding)

    @property
    def warmup_epochs(self) -> int:
        return self._fill.warmup_epochs

    @property
    def waited(self) -> float:
        """Seconds spent waiting for input: while filling (cached chunks cost none)."""
        return self._fill.waited

    def __iter__(self) -> DeviceCache:
        return self

    def position(self) -> dict[str, Any]:
        """``{"chunk": i}`` (and the fill's mark): the order is a pure function of (seed, data
        pass)."""
        return {"chunk": self.iteration, **self._fill.mark}

    def chunk_spec(self) -> dict[str, Any] | None:
        return None  # its chunks are gathered from the cache: no pipeline run tells ahead

    def peek(self) -> dict[str, jax.Array]:
        """The next chunk, without consuming it."""
        return self._next(peek=True)

    def __next__(self) -> dict[str, jax.Array]:
        return self._next(peek=False)

    def _next(self, peek: bool) -> dict[str, jax.Array]:
        if self._data is None:
            batch = self._fill.step(self, peek)
            if batch is not None:
                return batch
        index, mask = self.plan.chunk(self.iteration, self.orders)
        self.iteration += 0 if peek else 1
        batch = self._gather(self._data, self.placement.shard_global_rows(index.astype(np.int32)))
        batch["mask"] = self.placement.shard_global_rows(mask)
        return batch

    @property
    def recorded_bytes(self) -> int:
        """Bytes the recording holds now (its blocks, over all devices)."""
        return sum(leaf.nbytes for block in self._recorded for leaf in jax.tree_util.tree_leaves(block))

    def record(self, chunk: Any, i: int, chunks: int) -> None:
        """Keeps ``chunk`` (a pytree of one chunk's arrays) as chunk ``i`` of ``chunks``; chunks
        come in order, from 0. A block is allocated when chunk ``i`` is the first of it."""
        if not self._recorded:
            treedef, specs = buffer_specs(chunk, 1)
            size = sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in specs)
            self._block = max(1, min(chunks, BLOCK_BYTES // max(1, size)))
            self._rows = specs[0][0][1]
            self._specs = buffer_specs(chunk, self._block)
        b, j = divmod(i, self._block)
        if b == len(self._recorded):
            self._recorded.append(self._allocate(*self._specs))
        self._recorded[b] = self._record(self._recorded[b], chunk, np.int32(j))

    def place(self, slots: np.ndarray | None, chunks: int, what: str) -> None:
        """Scatters the rows of the ``chunks`` recorded chunks to their sample ``slots`` (flat,
        in recording order, the number of samples for a row to drop; None: the recording's
        ``"slot"`` entry holds them), a block at a time, releasing each, and checks that every
        sample was filled once. ``what`` tells the log how the data came (``""``, or ``"read
        once and "``)."""
        n = self.plan.num_samples
        rows = self._rows
        empty = jax.jit(_empty, static_argnums=(1,), out_shardings=self.placement.replicated)
        data, filled = empty(self._recorded[0], n)
        place = jax.jit(_place_block, donate_argnums=(0, 1), out_shardings=self.placement.replicated)
        per_block = self._block * rows
        for b in range(len(self._recorded)):
            block, self._recorded[b] = self._recorded[b], None
            part = None
            if slots is not None:
                part = np.full(per_block, n, np.int32)  # past the recording: dropped
                got = slots[b * per_block : (b + 1) * per_block]
                part[: len(got)] = got
            valid = np.int32(min(per_block, chunks * rows - b * per_block))
            data, filled = place(data, filled, block, part, valid)
            del block  # released (not donated: no output has its shape)
        self._recorded = []
        if not bool(jnp.all(filled == 1)):  # a fill's slots are not where the samples are
            raise RuntimeError(f"the device cache of {n} samples was not filled once each")
        self._data = data
        log.info("easyfit: %d samples %scached on the device; DALI pipelines released", n, what)

    def close(self) -> None:
        """Releases the pipelines and the cached data in device memory."""
        self._fill.close()
        self._recorded = []
        self._data = None


class Recording:
    """Fills the cache from ``stream`` (a streaming loader of the same plan) while it streams,
    until every sample has been seen; the stream is then closed.

    Each chunk is recorded when the next one is asked for (the last one at once), so that the
    first step waits for nothing but its chunk: the recording's first block, its compilation
    and the chunk's sample indices come after it. The chunk is not donated to the step, so it
    is still whole then."""

    def __init__(self, stream: Stream):
        self.stream = stream
        self.mark: dict[str, Any] = {}
        self._start = stream.iteration
        self._chunks = chunks_to_cover(stream.plan, self._start)  # to record
        self._indices: list[tuple[np.ndarray, np.ndarray]] = []  # recorded (sample index, mask)
        self._pending: tuple[Any, int] | None = None  # the chunk streamed last, and its index

    @property
    def warmup_epochs(self) -> int:
        """Those that stream while recording (one, from an epoch's start, when an epoch is a
        pass)."""
        cpe = self.stream.plan.chunks_per_epoch
        return -(-(self._start + self._chunks) // cpe) - self._start // cpe

    @property
    def waited(self) -> float:
        return self.stream.waited

    def step(self, cache: DeviceCache, peek: bool) -> dict[str, jax.Array] | None:
        if peek:
            return self.stream.peek()
        self._record_pending(cache)
        batch = next(self.stream)
        data = {k: v for k, v in batch.items() if k != "mask"}  # x, y (pytrees), weights
        self._pending = data, cache.iteration
        if len(self._indices) + 1 == self._chunks:
            self._record_pending(cache)
            cache.place(self._slots(cache.plan.num_samples), self._chunks, "")
            self._indices.clear()
            self.stream.close()
        cache.iteration += 1
        return batch

    def _record_pending(self, cache: DeviceCache) -> None:
        """Records the pending chunk, if any."""
        if self._pending is not None:
            data, iteration = self._pending
            self._pending = None
            cache.record(data, len(self._indices), self._chunks)
            self._indices.append(cache.plan.chunk(iteration, cache.orders))

    def _slots(self, n: int) -> np.ndarray:
        """Each recorded row's sample: its first row holds it, padding and repeats are dropped."""
        index = np.concatenate([i for i, _ in self._indices])
        valid = np.concatenate([m for _, m in self._indices])
        flat = np.where(valid, index, n)
        first = np.unique(flat, return_index=True)[1]  # each sample once: its first row
        slots = np.full(len(flat), n, np.int32)  # padding and repeats: out of range, dropped
        slots[first] = flat[first]
        return slots

    def close(self) -> None:
        self.stream.close()
        self._indices.clear()
        self._pending = None


class OrderedRead:
    """Fills the cache at the first chunk by reading the source once, unshuffled, with
    ``pipelines()`` (reader pipelines of a plan of one whole pass that does not shuffle).
    Positions are marked ``"cached"``: a resumed fit must fill its cache as this one did."""

    #: The first epoch waits for the read.
    warmup_epochs = 1

    def __init__(self, pipelines: Callable[[], Any]):
        self.mark: dict[str, Any] = {"cached": True}
        self.waited = 0.0
        self._pipelines = pipelines

    def step(self, cache: DeviceCache, peek: bool) -> None:
        began = time.perf_counter()
        pipes = self._pipelines()
        try:
            chunks = pipes.plan.chunks_per_epoch
            for i in range(chunks):
                out = pipes.produce(i)
                cache.record({"x": out["x"], "y": out["y"], "slot": pipes.slots(i)}, i, chunks)
        finally:
            pipes.close()
        cache.place(None, chunks, "read once and ")
        self.waited += time.perf_counter() - began

    def close(self) -> None:
        pass


#: The name :class:`OrderedRead` had before; kept for a release.
OneRead = OrderedRead


def chunks_to_cover(plan: Plan, start: int, orders: Orders | None = None) -> int:
    """How many chunks of the stream, from chunk ``start``, hold every sample at least once.

    From a pass's start, that pass holds them all; from inside pass ``p``, the samples that pass
    ``p`` put before the start come again in pass ``p + 1``: the last of them to come there ends
    the cover. Only those two passes' orders are drawn, whatever the number of chunks.

    Example:
        >>> from easyfit.data.cache import chunks_to_cover
        >>> from easyfit.data.plan import Plan
        >>> chunks_to_cover(Plan(num_samples=10, batch_size=4), 0)  # a pass: 3 steps
        3
        >>> chunks_to_cover(Plan(num_samples=10, batch_size=4, shuffle=False, epoch_steps=2), 1)
        3
    """
    orders = Orders(plan) if orders is None else orders
    n, b, per_pass = plan.num_samples, plan.batch_size, plan.steps_per_pass
    first = int(plan.steps(start)[0][0])  # the stream's step that chunk ``start`` begins with
    data_pass, j = divmod(first, per_pass)
    if j == 0:
        last = first + per_pass - 1
    else:
        before = orders(data_pass)[: j * b]  # not in this pass from ``first`` on
        where = np.empty(n, np.int64)
        where[orders(data_pass + 1)] = np.arange(n)
        last = (data_pass + 1) * per_pass + int(where[before].max()) // b
    epoch, step = divmod(last, plan.steps_per_epoch)
    return epoch * plan.chunks_per_epoch + step // plan.steps_per_execution - start + 1


# A recording holds the batch less its mask: x and y (arrays, or dicts or tuples of arrays for
# structured arrays) and the sample weights when there are some; each leaf on its own.


def buffer_specs(data: Any, chunks: int) -> tuple[Any, tuple[tuple[tuple[int, ...], str], ...]]:
    """The structure of ``data`` (a pytree of one chunk's arrays) and each leaf's ``(shape,
    dtype)`` for ``chunks`` of them: hashable, the static arguments of :func:`chunk_buffers`."""
    leaves, treedef = jax.tree_util.tree_flatten(data)
    return treedef, tuple(((chunks, *leaf.shape), str(leaf.dtype)) for leaf in leaves)


def chunk_buffers(treedef: Any, specs: tuple[tuple[tuple[int, ...], str], ...]) -> Any:
    """Zeros of each leaf's ``(shape, dtype)``: the chunks of a recording, before the first."""
    return jax.tree_util.tree_unflatten(treedef, [jnp.zeros(shape, dtype) for shape, dtype in specs])


def record_chunk(recorded: Any, chunk: Any, i: jax.Array) -> Any:
    """``recorded`` with chunk ``i`` written in place (one compilation for the whole recording)."""
    return jax.tree_util.tree_map(lambda value, new: value.at[i].set(new), recorded, chunk)


def _split(block: Any) -> tuple[Any, Any]:
    """A block less its ``"slot"`` entry, and that entry (None when the block has none: the
    slots are given)."""
    if isinstance(block, dict) and "slot" in block:
        return {k: v for k, v in block.items() if k != "slot"}, block["slot"]
    return block, None


def _empty(block: Any, n: int) -> tuple[Any, jax.Array]:
    """Zeros of ``n`` rows for each of a block's leaves (less its slots), and of the count of
    rows each of the ``n`` slots gets: the cache before :func:`_place_block` fills it."""
    data = jax.tree_util.tree_map(lambda c: jnp.zeros((n, *c.shape[2:]), c.dtype), _split(block)[0])
    return data, jnp.zeros(n, jnp.int32)


def _place_block(
    data: Any, filled: jax.Array, block: Any, slots: Any, valid: jax.Array
) -> tuple[Any, jax.Array]:
    """``data`` with one block's rows set at their slots, and ``filled`` counting each slot's
    rows. ``slots``: the block's, flat, or None when the block holds them as its ``"slot"``
    entry (:class:`OrderedRead`). Rows from ``valid`` on (chunks past the recording's end) and
    slots of ``n`` (padding, repeats) are dropped."""
    block, recorded = _split(block)
    slots = (slots if recorded is None else recorded).reshape(-1)
    n = filled.shape[0]
    slots = jnp.where(jnp.arange(slots.shape[0]) < valid, slots, n)

    def one(cached: jax.Array, chunks: jax.Array) -> jax.Array:
        return cached.at[slots].set(chunks.reshape(-1, *chunks.shape[2:]), mode="drop")

    return jax.tree_util.tree_map(one, data, block), filled.at[slots].add(1, mode="drop")


def gather_rows(data: Any, index: jax.Array) -> Any:
    """The rows ``index`` of every cached leaf: a chunk from the device cache."""
    return jax.tree_util.tree_map(lambda value: jnp.take(value, index, axis=0), data)
