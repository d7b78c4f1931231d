"""Devices, mesh and shardings: data parallel over every device of every process."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["DATA_AXIS", "Placement", "gather_to_host", "local_rows"]

DATA_AXIS = "data"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where parameters and batches live.

    Parameters are replicated on every device; batches are split along their first axis over
    the mesh's ``"data"`` axis, in mesh order, so device ``i`` holds rows ``[i*b, (i+1)*b)``.

    Example:
        >>> from easyfit.parallel import Placement
        >>> placement = Placement.create()
        >>> placement.num_shards == len(placement.local_shards) == 1
        True
    """

    mesh: Mesh

    @classmethod
    def create(cls, devices: Sequence[jax.Device] | None = None) -> Placement:
        devices = list(jax.devices() if devices is None else devices)
        return cls(Mesh(np.asarray(devices), (DATA_AXIS,)))

    @property
    def devices(self) -> list[jax.Device]:
        return list(self.mesh.devices.flat)

    @property
    def num_shards(self) -> int:
        return self.mesh.devices.size

    @property
    def local_shards(self) -> list[tuple[int, jax.Device]]:
        """(global shard index, device) of this process's devices, in mesh order."""
        me = jax.process_index()
        return [(i, d) for i, d in enumerate(self.devices) if d.process_index == me]

    @property
    def platform(self) -> str:
        return self.devices[0].platform

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    @property
    def data(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(DATA_AXIS))

    def check_batch_size(self, batch_size: int, argument: str = "batch_size") -> None:
        if batch_size < 1 or batch_size % self.num_shards:
            raise ValueError(
                f"{argument}={batch_size} does not divide evenly over "
                f"{self.num_shards} devices; use a multiple of {self.num_shards}"
            )

    def replicate(self, tree):
        """Puts a host pytree on every device."""
        return jax.device_put(tree, self.replicated)

    def abstract(self, tree: Any, replicated: bool = False) -> Any:
        """Shapes, dtypes and shardings of ``tree``'s arrays (replicated ones with
        ``replicated``), as ``jax.ShapeDtypeStruct`` leaves: a target to compile or restore to."""
        return jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(
                a.shape,
                a.dtype,
                sharding=self.replicated if replicated else a.sharding,
                weak_type=getattr(a, "weak_type", False),  # as jit keys its compilations
            ),
            tree,
        )

    def shard_host_rows(self, local: np.ndarray) -> jax.Array:
        """Global array from this process's rows (its devices' rows, concatenated in order)."""
        global_shape = (local.shape[0] * self.num_shards // len(self.local_shards), *local.shape[1:])
        return jax.make_array_from_process_local_data(self.data, local, global_shape)

    def shard_global_rows(self, rows: np.ndarray) -> jax.Array:
        """Global array from host data that every process holds whole (shard-major rows)."""
        per_shard = rows.shape[0] // self.num_shards
        mine = np.concatenate([np.arange(s * per_shard, (s + 1) * per_shard) for s, _ in self.local_shards])
        return self.shard_host_rows(rows[mine])

    def shard_device_rows(self, per_device: Sequence[jax.Array]) -> jax.Array:
        """Global array from one array per local device (already on that device)."""
        rows = per_device[0].shape[0]
        global_shape = (rows * self.num_shards, *per_device[0].shape[1:])
        return jax.make_array_from_single_device_arrays(global_shape, self.data, list(per_device))


def local_rows(a: jax.Array) -> np.ndarray:
    """This process's rows of a batch-sharded array, on the host."""
    return np.concatenate([np.asarray(s.data) for s in a.addressable_shards])


def gather_to_host(a: jax.Array) -> np.ndarray:
    """The whole of a global array on the host of every process."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(a, tiled=True))
    return np.asarray(a)
