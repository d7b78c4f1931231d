"""Devices, mesh and shardings: data parallel over every device of every process, or over the
``"data"`` axis of a mesh with other axes too (``Trainer(mesh=)``: tensor parallel by rules)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
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

    Batches are split along their first axis over the mesh's ``"data"`` axis, in mesh order, so
    shard ``i`` holds rows ``[i*b, (i+1)*b)``; by default that axis is every device, and device
    ``i`` holds shard ``i``. On a mesh with other axes (``{"data": 4, "model": 2}``) the devices
    along them hold the same rows.

    Example:
        >>> from easyfit.parallel import Placement
        >>> placement = Placement.create()
        >>> placement.num_shards == len(placement.local_shards) == 1
        True
    """

    mesh: Mesh

    @classmethod
    def create(
        cls, devices: Sequence[jax.Device] | None = None, axes: Mapping[str, int] | None = None
    ) -> Placement:
        """The mesh over ``devices`` (default: all), with the axes ``axes`` names in order and
        their sizes (one may be -1: the devices left; default ``{"data": -1}``).

        Raises:
            ValueError: ``axes`` lacks ``"data"``, or its sizes do not multiply to the number
                of devices.
        """
        devices = list(jax.devices() if devices is None else devices)
        sizes = dict(axes or {DATA_AXIS: -1})
        shown = f"mesh={sizes}"
        if DATA_AXIS not in sizes or not all(
            isinstance(v, int) and (v > 0 or v == -1) for v in sizes.values()
        ):
            raise ValueError(f"{shown}: expected axis sizes (positive, or one -1) with a {DATA_AXIS!r} axis")
        known = math.prod(v for v in sizes.values() if v != -1)
        free = [k for k, v in sizes.items() if v == -1]
        if len(free) > 1 or len(devices) % known or (not free and known != len(devices)):
            raise ValueError(f"{shown}: the axes' sizes do not multiply to the {len(devices)} devices")
        for k in free:
            sizes[k] = len(devices) // known
        grid = np.asarray(devices).reshape(tuple(sizes.values()))
        return cls(Mesh(grid, tuple(sizes)))

    @property
    def devices(self) -> list[jax.Device]:
        return list(self.mesh.devices.flat)

    @property
    def num_shards(self) -> int:
        """Shards of a batch: the size of the mesh's ``"data"`` axis (every device's when the
        mesh has no other)."""
        return int(self.mesh.shape[DATA_AXIS])

    @property
    def local_shards(self) -> list[tuple[int, jax.Device]]:
        """(global shard index, device) of the batch shards this process's devices hold, in
        mesh order: on a mesh with other axes than ``"data"``, the shard's first device here
        (the others of the shard get copies: :meth:`shard_device_rows`)."""
        me = jax.process_index()
        shards = []
        for i, group in enumerate(self._shard_devices()):
            mine = [d for d in group if d.process_index == me]
            if mine:
                shards.append((i, mine[0]))
        return shards

    def _shard_devices(self) -> list[list[jax.Device]]:
        """The devices holding each batch shard (one each on a mesh of only ``"data"``)."""
        grid = np.moveaxis(self.mesh.devices, self.mesh.axis_names.index(DATA_AXIS), 0)
        return [list(row.flat) for row in grid.reshape(self.num_shards, -1)]

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
        """Global array from one array per local shard (already on that shard's device of
        :attr:`local_shards`; copied to the shard's other local devices, if any)."""
        rows = per_device[0].shape[0]
        global_shape = (rows * self.num_shards, *per_device[0].shape[1:])
        arrays = list(per_device)
        if self.mesh.devices.ndim > 1:
            groups = self._shard_devices()
            me = jax.process_index()
            arrays = [
                a if d == first else jax.device_put(a, d)
                for a, (i, first) in zip(per_device, self.local_shards, strict=True)
                for d in groups[i]
                if d.process_index == me
            ]
        return jax.make_array_from_single_device_arrays(global_shape, self.data, arrays)


def local_rows(a: jax.Array) -> np.ndarray:
    """This process's rows of a batch-sharded array, on the host."""
    return np.concatenate([np.asarray(s.data) for s in a.addressable_shards])


def gather_to_host(a: jax.Array) -> np.ndarray:
    """The whole of a global array on the host of every process."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(a, tiled=True))
    return np.asarray(a)
