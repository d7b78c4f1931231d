"""Device-cached training: decode once with DALI, then shuffle and batch on the device.

While the stream goes through DALI, every decoded chunk is also kept on the device until every
sample has been seen (the first full epoch; more chunks when an epoch is shorter than a pass,
``steps_per_epoch``, or starts mid-pass); they are then scattered, by sample index, into one
array per output (per array of structured ``x`` and ``y``, and the sample weights; replicated on
every device, in the source's order). From then on each chunk
is a gather of its indices (the same :class:`~easyfit.data.plan.Plan`, so the same samples in
the same steps as streaming): no input pipeline is left, and DALI's pipelines are released. A
source read by DALI's own reader cannot be replayed so: :mod:`easyfit.data.reader_cache` reads
it once before the first epoch.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ..parallel import DATA_AXIS, Placement
from .loader import Loader
from .plan import Orders, Plan
from .sources.base import ReaderSource, Source

__all__ = [
    "CachedLoader",
    "cache_budget",
    "chunks_to_cover",
    "chunk_buffers",
    "decide_cache",
    "gather_rows",
    "record_chunk",
    "scatter_rows",
]

log = logging.getLogger("easyfit")

#: Fraction of one device's memory (host memory on a CPU-only machine) the cache may take.
CACHE_FRACTION = 0.4


def cache_budget(placement: Placement) -> int:
    """Bytes the cache may take on each device."""
    stats = placement.local_shards[0][1].memory_stats() or {}
    if "bytes_limit" in stats:
        return int(CACHE_FRACTION * (stats["bytes_limit"] - stats.get("bytes_in_use", 0)))
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    # CPU devices share the host's memory: each holds a replica.
    return int(CACHE_FRACTION * host / max(1, len(placement.local_shards)))


def decide_cache(cache: bool | str, source: Source, placement: Placement) -> tuple[bool, str]:
    """Whether to cache, and why (a sentence for the log).

    Args:
        cache: the user's choice: ``"auto"``, True or False.
        source: the training source (its ``sample_nbytes`` and ``random``).
        placement: the devices.
    """
    if cache not in ("auto", True, False):
        raise ValueError(f"cache={cache!r}: expected 'auto', True or False")
    if cache is False:
        return False, "cache=False: streaming from DALI every epoch"
    # a DALI reader's source is read once, unshuffled, before the first epoch (reader_cache.py)
    when = (
        "after one read by its DALI reader" if isinstance(source, ReaderSource) else "after the first epoch"
    )
    if source.random:
        if cache is True:
            raise ValueError(
                "cache=True: the training source applies random augmentation, "
                "which must run every epoch; use cache=False or 'auto'"
            )
        return False, "random augmentation must run every epoch: streaming from DALI"
    if source.sample_nbytes is None:
        if cache is True:
            return True, f"cache=True: caching the decoded dataset {when}"
        return False, f"{source.describe()} does not tell its decoded size: streaming from DALI"
    need = source.sample_nbytes * source.num_samples
    budget = _agreed(cache_budget(placement))
    size = f"{need / 2**20:,.0f} MiB per device, budget {budget / 2**20:,.0f} MiB"
    if need > budget:
        return False, (
            f"the decoded dataset would not fit in device memory ({size}): streaming from DALI every epoch"
        )
    return True, f"caching the decoded dataset on the device {when} ({size})"


def _agreed(budget: int) -> int:
    """Process 0's budget in every process: they must all make the same choice."""
    if jax.process_count() == 1:
        return budget
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int64(budget)))


class CachedLoader:
    """Streams from ``loader`` while recording, until every sample has been seen, then gathers
    chunks from device memory. Same interface as :class:`Loader`."""

    def __init__(self, loader: Loader):
        self.loader = loader
        self.plan = loader.plan
        self.placement = loader.placement
        self.iteration = loader.iteration
        self._orders = Orders(self.plan)
        self._start = self.iteration
        self._chunks = chunks_to_cover(self.plan, self.iteration, self._orders)  # to record
        self._recorded: dict[str, Any] | None = None  # the recorded chunks, stream order
        self._indices: list[tuple[np.ndarray, np.ndarray]] = []  # their (sample index, mask)
        self._data: dict[str, Any] | None = None
        self._gather = jax.jit(gather_rows, out_shardings=self.placement.data)
        # chunk rows stay on their devices: (chunks, rows, ...) sharded on the rows
        sharding = NamedSharding(self.placement.mesh, P(None, DATA_AXIS))
        self._record = jax.jit(record_chunk, donate_argnums=(0,), out_shardings=sharding)
        self._allocate = jax.jit(chunk_buffers, static_argnums=(0, 1), out_shardings=sharding)

    def __iter__(self) -> CachedLoader:
        return self

    def position(self) -> dict[str, int]:
        """Where the stream stands (see :meth:`Loader.position`)."""
        return {"chunk": self.iteration}

    def peek(self) -> dict[str, jax.Array]:
        return self.loader.peek() if self._data is None else self._next(peek=True)

    @property
    def warmup_epochs(self) -> int:
        """Epochs before input comes as in every later one: those that stream while recording
        (one, from an epoch's start, when an epoch is a pass)."""
        cpe = self.plan.chunks_per_epoch
        return -(-(self._start + self._chunks) // cpe) - self._start // cpe

    @property
    def waited(self) -> float:
        """Seconds spent waiting for input: the first epoch's stream (cached ones cost none)."""
        return self.loader.waited

    def __next__(self) -> dict[str, jax.Array]:
        return self._next(peek=False)

    def _next(self, peek: bool) -> dict[str, jax.Array]:
        if self._data is None:
            batch = next(self.loader)
            data = {k: v for k, v in batch.items() if k != "mask"}  # x, y (pytrees), weights
            if self._recorded is None:
                self._recorded = self._allocate(*buffer_specs(data, self._chunks))
            self._recorded = self._record(self._recorded, data, np.int32(len(self._indices)))
            self._indices.append(self.plan.chunk(self.iteration, self._orders))
            if len(self._indices) == self._chunks:
                self._fill()
            self.iteration += 1
            return batch
        index, mask = self.plan.chunk(self.iteration, self._orders)
        self.iteration += 0 if peek else 1
        rows = self.placement.shard_global_rows(index.astype(np.int32))
        batch = self._gather(self._data, rows)
        batch["mask"] = self.placement.shard_global_rows(mask)
        return batch

    def _fill(self) -> None:
        n = self.plan.num_samples
        index = np.concatenate([i for i, _ in self._indices])
        valid = np.concatenate([m for _, m in self._indices])
        flat = np.where(valid, index, n)
        first = np.unique(flat, return_index=True)[1]  # each sample once: its first row
        index = np.full(len(flat), n, np.int32)  # padding and repeats: out of range, dropped
        index[first] = flat[first]
        scatter = jax.jit(scatter_rows, static_argnums=(2,), out_shardings=self.placement.replicated)
        self._data = scatter(self._recorded, index, n)
        self._recorded = None  # released (not donated: no output has its shape)
        self._indices.clear()
        self.loader.close()
        log.info("easyfit: %d samples cached on the device; DALI pipelines released", n)

    def close(self) -> None:
        """Releases the pipelines and the cached data in device memory."""
        self.loader.close()
        self._recorded = None
        self._data = None
        self._indices.clear()


def chunks_to_cover(plan: Plan, start: int, orders: Orders | None = None) -> int:
    """How many chunks of the stream, from chunk ``start``, hold every sample at least once.

    Example:
        >>> from easyfit.data.cache import chunks_to_cover
        >>> from easyfit.data.plan import Plan
        >>> chunks_to_cover(Plan(num_samples=10, batch_size=4), 0)  # a pass: 3 steps
        3
        >>> chunks_to_cover(Plan(num_samples=10, batch_size=4, shuffle=False, epoch_steps=2), 1)
        3
    """
    orders = Orders(plan) if orders is None else orders
    seen = np.zeros(plan.num_samples, bool)
    left, count = plan.num_samples, 0
    while left:
        index, mask = plan.chunk(start + count, orders)
        new = np.unique(index[mask])
        left -= int(np.count_nonzero(~seen[new]))
        seen[new] = True
        count += 1
    return count


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


def scatter_rows(recorded: Any, index: jax.Array, n: int) -> Any:
    """The recorded rows of every leaf at their sample ``index`` in ``n`` rows (an index past the
    end, a padding row, is dropped)."""

    def one(chunks: jax.Array) -> jax.Array:
        rows = chunks.reshape(-1, *chunks.shape[2:])
        return jnp.zeros((n, *rows.shape[1:]), rows.dtype).at[index].set(rows, mode="drop")

    return jax.tree_util.tree_map(one, recorded)


def gather_rows(data: Any, index: jax.Array) -> Any:
    """The rows ``index`` of every cached leaf: a chunk from the device cache."""
    return jax.tree_util.tree_map(lambda value: jnp.take(value, index, axis=0), data)
