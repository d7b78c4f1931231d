"""Device-cached training: decode once with DALI, then shuffle and batch on the device.

While the first full epoch streams through DALI, every decoded chunk is also kept on the device;
at its end they are scattered, by sample index, into one array per output (per array of
structured ``x`` and ``y``, and the sample weights; replicated on every device, in the source's
order). From then on each chunk is a gather of that epoch's indices (the
same :class:`~easyfit.data.order.Plan`, so the same samples in the same steps as streaming):
no input pipeline is left, and DALI's pipelines are released.
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
from .sources.base import ReaderSource, Source

__all__ = ["CachedLoader", "cache_budget", "decide_cache"]

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
    if isinstance(source, ReaderSource):
        if cache is True:
            raise ValueError(
                f"cache=True: {source.describe()} is read by a DALI reader in its "
                "own order, which the device cache cannot replay; use cache=False"
            )
        return False, "a DALI reader keeps its own order: streaming from DALI every epoch"
    if source.random:
        if cache is True:
            raise ValueError(
                "cache=True: the training source applies random augmentation, "
                "which must run every epoch; use cache=False or 'auto'"
            )
        return False, "random augmentation must run every epoch: streaming from DALI"
    if source.sample_nbytes is None:
        if cache is True:
            return True, "cache=True: caching the decoded dataset after the first epoch"
        return False, f"{source.describe()} does not tell its decoded size: streaming from DALI"
    need = source.sample_nbytes * source.num_samples
    budget = _agreed(cache_budget(placement))
    size = f"{need / 2**20:,.0f} MiB per device, budget {budget / 2**20:,.0f} MiB"
    if need > budget:
        return False, (
            f"the decoded dataset would not fit in device memory ({size}): streaming from DALI every epoch"
        )
    return True, f"caching the decoded dataset on the device after the first epoch ({size})"


def _agreed(budget: int) -> int:
    """Process 0's budget in every process: they must all make the same choice."""
    if jax.process_count() == 1:
        return budget
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int64(budget)))


class CachedLoader:
    """Streams the first full epoch from ``loader`` while recording it, then gathers chunks from
    device memory. Same interface as :class:`Loader`."""

    def __init__(self, loader: Loader):
        self.loader = loader
        self.plan = loader.plan
        self.placement = loader.placement
        self.iteration = loader.iteration
        cpe = self.plan.chunks_per_epoch
        self._record_from = -(-self.iteration // cpe) * cpe  # first whole epoch from here
        self._recorded: dict[str, Any] | None = None  # the epoch's chunks, stream order
        self._orders: list[tuple[np.ndarray, np.ndarray]] = []  # their (sample index, mask)
        self._data: dict[str, Any] | None = None
        self._gather = jax.jit(_gather, out_shardings=self.placement.data)
        # chunk rows stay on their devices: (chunks, rows, ...) sharded on the rows
        sharding = NamedSharding(self.placement.mesh, P(None, DATA_AXIS))
        self._record = jax.jit(_record, donate_argnums=(0,), out_shardings=sharding)
        self._zeros = jax.jit(_zeros, static_argnums=(0, 1), out_shardings=sharding)

    def __iter__(self) -> CachedLoader:
        return self

    def position(self) -> dict[str, int]:
        """Where the stream stands (see :meth:`Loader.position`)."""
        return {"chunk": self.iteration}

    def peek(self) -> dict[str, jax.Array]:
        return self.loader.peek() if self._data is None else self._next(peek=True)

    #: Epochs before input comes as in every later one: the first streams while it records.
    warmup_epochs = 1

    @property
    def waited(self) -> float:
        """Seconds spent waiting for input: the first epoch's stream (cached ones cost none)."""
        return self.loader.waited

    def __next__(self) -> dict[str, jax.Array]:
        return self._next(peek=False)

    def _next(self, peek: bool) -> dict[str, jax.Array]:
        if self._data is None:
            batch = next(self.loader)
            if self.iteration >= self._record_from:
                data = {k: v for k, v in batch.items() if k != "mask"}  # x, y (pytrees), weights
                if self._recorded is None:
                    shapes = jax.tree_util.tree_map(
                        lambda a: jax.ShapeDtypeStruct((self.plan.chunks_per_epoch, *a.shape), a.dtype), data
                    )
                    self._recorded = self._allocate(shapes)
                self._recorded = self._record(self._recorded, data, np.int32(len(self._orders)))
                self._orders.append(self.plan.chunk(self.iteration))
                if len(self._orders) == self.plan.chunks_per_epoch:
                    self._fill()
            self.iteration += 1
            return batch
        index, mask = self.plan.chunk(self.iteration)
        self.iteration += 0 if peek else 1
        rows = self.placement.shard_global_rows(index.astype(np.int32))
        batch = self._gather(self._data, rows)
        batch["mask"] = self.placement.shard_global_rows(mask)
        return batch

    def _allocate(self, shapes: Any) -> Any:
        """Zeros of ``shapes`` (a pytree of ShapeDtypeStruct), each sharded on its rows."""
        leaves, treedef = jax.tree_util.tree_flatten(shapes)
        return self._zeros(treedef, tuple((tuple(s.shape), str(s.dtype)) for s in leaves))

    def _fill(self) -> None:
        n = self.plan.num_samples
        index = np.concatenate([i for i, _ in self._orders])
        valid = np.concatenate([m for _, m in self._orders])
        index = np.where(valid, index, n).astype(np.int32)  # padding rows: out of range, dropped
        scatter = jax.jit(_scatter, static_argnums=(2,), out_shardings=self.placement.replicated)
        self._data = scatter(self._recorded, index, n)
        self._recorded = None  # released (not donated: no output has its shape)
        self._orders.clear()
        self.loader.close()
        log.info("easyfit: %d samples cached on the device; DALI pipelines released", n)

    def close(self) -> None:
        """Releases the pipelines and the cached data in device memory."""
        self.loader.close()
        self._recorded = None
        self._data = None
        self._orders.clear()


# The recorded data is the batch less its mask: x and y (arrays, or dicts or tuples of arrays
# for structured arrays) and the sample weights when there are some; each leaf on its own.


def _zeros(treedef: Any, specs: tuple[tuple[tuple[int, ...], str], ...]) -> Any:
    return jax.tree_util.tree_unflatten(treedef, [jnp.zeros(shape, dtype) for shape, dtype in specs])


def _record(recorded: Any, chunk: Any, i: jax.Array) -> Any:
    """``recorded`` with chunk ``i`` written in place (one compilation for the whole epoch)."""
    return jax.tree_util.tree_map(lambda value, new: value.at[i].set(new), recorded, chunk)


def _scatter(recorded: Any, index: jax.Array, n: int) -> Any:
    def one(chunks: jax.Array) -> jax.Array:
        rows = chunks.reshape(-1, *chunks.shape[2:])
        return jnp.zeros((n, *rows.shape[1:]), rows.dtype).at[index].set(rows, mode="drop")

    return jax.tree_util.tree_map(one, recorded)


def _gather(data: Any, index: jax.Array) -> dict[str, Any]:
    return jax.tree_util.tree_map(lambda value: jnp.take(value, index, axis=0), data)
