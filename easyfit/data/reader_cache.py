"""The device cache of a source read by DALI's own reader (a :class:`ReaderSource`).

A reader picks its own order and cannot seek, so the cache of :mod:`easyfit.data.cache` (record
the first epoch while training streams it, then replay the same
:class:`~easyfit.data.plan.Plan`) cannot replay it. Instead, before the first chunk, the reader
pipelines read the dataset once, unshuffled: each reads its contiguous shard in order, so the
``j``-th row of shard ``k`` is sample ``k * n // shards + j`` of the source's own order (an LMDB's
key order) whatever the number of pipelines
(:meth:`~easyfit.data.reader_pipelines.ReaderPipelines.slots`), and the rows DALI pads shards and
runs with are dropped. The decoded samples are scattered to those places, one array per output
replicated on every device (as the other cache holds them), and the pipelines are released.

From then on every chunk, the first epoch's included, is a gather of the plan's permutation: the
order is a pure function of (seed, data pass), as for an indexed source, a position is a chunk
index, and resuming is exact. Training on the reader's own (shuffled) order during the first epoch while
recording it would save that one read, but a fit resumed inside that epoch could not fill its
cache (the reader, restarted from its DALI checkpoint, never reads the samples already trained on
again), and the first epoch would depend on the number of pipelines.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ..errors import DataError
from ..parallel import DATA_AXIS, Placement
from .cache import buffer_specs, chunk_buffers, gather_rows, record_chunk, scatter_rows
from .plan import Plan
from .reader_pipelines import ReaderPipelines
from .sources.base import ReaderSource

__all__ = ["ReaderCache", "resume_mode"]

log = logging.getLogger("easyfit")


class ReaderCache:
    """Chunks of a :class:`ReaderSource` gathered from device memory after one unshuffled read
    by its DALI reader. Same interface as :class:`~easyfit.data.loader.Loader`.

    Args:
        source: the reader-driven source.
        plan: the batching plan: a permutation of the source's own order every epoch, or that
            order itself when it does not shuffle.
        placement: the devices.
        start: index of the first chunk.
        position: a position from :meth:`position` to start at instead of ``start``.
        num_threads: DALI threads per reader pipeline (None: chosen from the cores).
        pipelines: reader pipelines per process on CPUs (None: 1).
        **options: the other loader options (none applies to a reader's one read).

    Example:
        >>> import numpy as np, easyfit as ef
        >>> from easyfit.data.plan import epoch_permutation
        >>> from easyfit.data.reader_cache import ReaderCache
        >>> source = ef.data.Caffe2LMDB(MNIST_FORMATS["lmdb"] + "/val")  # 100 records
        >>> loader = ReaderCache(source, ef.data.Plan(100, 50, seed=0), ef.parallel.Placement.create())
        >>> y = np.asarray(next(loader)["y"])  # epoch 0's permutation of the key order
        >>> bool((y == source.known_labels()[epoch_permutation(100, seed=0, epoch=0)[:50]]).all())
        True
        >>> loader.position()
        {'chunk': 1, 'cached': True}
        >>> loader.close()
    """

    #: Epochs before input comes as in every later one: the first waits for the read.
    warmup_epochs = 1

    def __init__(
        self,
        source: ReaderSource,
        plan: Plan,
        placement: Placement,
        *,
        start: int = 0,
        position: Mapping[str, Any] | None = None,
        num_threads: int | None = None,
        pipelines: int | None = None,
        **options: Any,
    ):
        source.check()
        self.source = source
        self.plan = plan
        self.placement = placement
        self.iteration = int(position["chunk"]) if position is not None else start
        #: Seconds spent waiting for input: the read (chunks from the cache cost none).
        self.waited = 0.0
        self._threads = num_threads
        self._pipelines = pipelines
        self._data: dict[str, jax.Array] | None = None
        self._gather = jax.jit(gather_rows, out_shardings=placement.data)

    def __iter__(self) -> ReaderCache:
        return self

    def position(self) -> dict[str, Any]:
        """``{"chunk": i, "cached": True}``: the order is a pure function of (seed, data
        pass); the mark tells a resumed fit that the backup was not streamed (see
        :func:`resume_mode`)."""
        return {"chunk": self.iteration, "cached": True}

    def peek(self) -> dict[str, jax.Array]:
        """The next chunk, without consuming it."""
        return self._next(peek=True)

    def __next__(self) -> dict[str, jax.Array]:
        return self._next(peek=False)

    def _next(self, peek: bool) -> dict[str, jax.Array]:
        if self._data is None:
            began = time.perf_counter()
            self._data = self._read()
            self.waited += time.perf_counter() - began
        index, mask = self.plan.chunk(self.iteration)
        self.iteration += 0 if peek else 1
        batch = self._gather(self._data, self.placement.shard_global_rows(index.astype(np.int32)))
        batch["mask"] = self.placement.shard_global_rows(mask)
        return batch

    def _read(self) -> dict[str, jax.Array]:
        """The source read once, unshuffled, into one replicated array per output (rows in the
        source's order)."""
        n = self.plan.num_samples
        pipes = ReaderPipelines(
            self.source,
            dataclasses.replace(self.plan, shuffle=False, epoch_steps=None),  # one whole pass
            self.placement,
            start=0,
            position=None,
            num_threads=self._threads,
            prefetch=2,
            training=False,
            pipelines=self._pipelines,
        )
        try:
            if pipes.num_samples != n:
                raise DataError(
                    f"{self.source.describe()}: its DALI reader counts {pipes.num_samples} samples"
                )
            chunks = pipes.plan.chunks_per_epoch
            # chunk rows stay on their devices: (chunks, rows, ...) sharded on the rows
            sharding = NamedSharding(self.placement.mesh, P(None, DATA_AXIS))
            record = jax.jit(record_chunk, donate_argnums=(0,), out_shardings=sharding)
            recorded = None
            for i in range(chunks):
                out = pipes.produce(i)
                chunk = {"x": out["x"], "y": out["y"], "slot": pipes.slots(i)}
                if recorded is None:
                    allocate = jax.jit(chunk_buffers, static_argnums=(0, 1), out_shardings=sharding)
                    recorded = allocate(*buffer_specs(chunk, chunks))
                recorded = record(recorded, chunk, np.int32(i))
        finally:
            pipes.close()
        assert recorded is not None  # a reader source holds samples
        place = jax.jit(_place, static_argnums=(1,), out_shardings=self.placement.replicated)
        data, once = place(recorded, n)
        if not bool(once):  # DALI's shards are not where slots() puts them
            raise RuntimeError(f"{self.source.describe()}: the unshuffled read missed samples")
        log.info("easyfit: %d samples read once and cached on the device; DALI pipelines released", n)
        return data

    def close(self) -> None:
        """Releases the cached data in device memory."""
        self._data = None


def resume_mode(
    cache: bool | str, use_cache: bool, why: str, position: Mapping[str, Any] | None
) -> tuple[bool, str]:
    """Whether a fit of a reader-driven source resumed at ``position`` caches, and why: as the
    backup's fit did, since the two read the samples in different orders. ``cache="auto"``
    follows a backup written while streaming; any other difference is refused.

    Args:
        cache: the user's choice.
        use_cache: what :func:`~easyfit.data.cache.decide_cache` chose.
        why: :func:`~easyfit.data.cache.decide_cache`'s sentence for that choice.
        position: the backup's loader position (None: nothing to follow).

    Example:
        >>> from easyfit.data.reader_cache import resume_mode
        >>> resume_mode("auto", True, "fits", {"chunk": 3, "dali": []})[0]
        False
        >>> resume_mode("auto", True, "fits", {"chunk": 3, "cached": True})
        (True, 'fits')
    """
    if position is None:
        return use_cache, why
    cached = bool(position.get("cached"))
    if cached == use_cache:
        return use_cache, why
    if cache == "auto" and not cached:
        return False, "resuming a backup written while streaming: streaming from DALI every epoch"
    raise ValueError(
        f"cache={cache!r}: the backup was written {'with' if cached else 'without'} the device "
        f"cache, which orders a DALI reader's samples differently; resume with cache={cached} "
        "(or delete the backup to start afresh)"
    )


def _place(recorded: dict[str, jax.Array], n: int) -> tuple[dict[str, jax.Array], jax.Array]:
    """Every recorded row at its slot (padding, slot ``n``, dropped), and whether each slot was
    filled exactly once."""
    slots = recorded["slot"].reshape(-1)
    filled = jnp.zeros(n, jnp.int32).at[slots].add(1, mode="drop")
    rows = {key: value for key, value in recorded.items() if key != "slot"}
    return scatter_rows(rows, slots, n), jnp.all(filled == 1)
