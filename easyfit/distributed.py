"""Several processes, one training run: a thin layer over JAX's own distributed runtime.

Every process runs the same script. ``initialize`` must come before anything touches a device;
after it, ``jax.devices()`` lists the devices of every process and the Trainer uses them all:
each process builds DALI pipelines for its own devices only, reads its devices' rows of every
global batch (the sample order is a function of seed and epoch, identical in every process), and
the jitted step reduces metrics across processes. Only process 0 prints progress.

When a process dies, the others stop with an error once they miss its heartbeats for
``heartbeat_timeout_seconds`` (30 s by default here, instead of JAX's 100 s): they never hang
forever.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

__all__ = ["initialize", "is_main_process"]

#: Seconds after which a silent process is declared dead and the others stop.
HEARTBEAT_TIMEOUT_S = 30


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *,
               local_device_ids: int | Sequence[int] | None = None,
               heartbeat_timeout_seconds: int = HEARTBEAT_TIMEOUT_S,
               initialization_timeout: int = 300) -> None:
    """Joins this process to a multi-process run (``jax.distributed.initialize``).

    With no arguments, JAX detects the cluster (SLURM, Open MPI, Cloud TPU, ...). Elsewhere, give
    the coordinator (process 0's ``host:port``), the number of processes and this one's index.

    Args:
        coordinator_address: ``host:port`` of process 0.
        num_processes: how many processes take part.
        process_id: this process's index, 0 .. num_processes - 1.
        local_device_ids: GPUs this process uses (default: all it sees).
        heartbeat_timeout_seconds: a process silent this long is declared dead; the others
            then stop with an error.
        initialization_timeout: seconds to wait for every process to join.

    Example:
        >>> import easyfit as ef
        >>> ef.distributed.is_main_process()  # a single process is the main one
        True
    """
    kwargs: dict[str, Any] = {}
    if local_device_ids is not None:
        kwargs["local_device_ids"] = local_device_ids
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               heartbeat_timeout_seconds=heartbeat_timeout_seconds,
                               initialization_timeout=initialization_timeout, **kwargs)


def is_main_process() -> bool:
    """True in process 0, the one that prints and writes files."""
    return jax.process_index() == 0
