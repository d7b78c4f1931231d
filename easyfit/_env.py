"""Process environment easyfit arranges before JAX starts its backend.

Two settings, each applied at import only while JAX's backend has not started yet (CUDA reads
them when it creates its context) and only where the user has not set them:

* ``--xla_gpu_enable_command_buffer=`` in ``XLA_FLAGS``. DALI's JAX outputs and XLA's CUDA-graph
  command buffers do not mix (with DALI 2.4 and JAX 0.11, cuBLAS fails with "internal operation
  failed" and XLA with "Failed to destroy CUDA graph"). Turning command buffers off costs
  nothing measurable for data-parallel training. If the backend has already started on a GPU,
  easyfit warns once with what to do.
* ``CUDA_DEVICE_MAX_CONNECTIONS=32``. CUDA maps its streams onto 8 hardware work queues by
  default, so DALI's streams share queues with XLA's: a DALI kernel then waits behind every
  training step queued before it, and the input starves while the GPU trains. With 32 queues
  the two run side by side, and the input keeps up (the measurements: docs/performance.md).
"""

from __future__ import annotations

import os
import sys
import warnings

_FLAG = "--xla_gpu_enable_command_buffer="
#: CUDA's hardware work queues per device (CUDA's default 8, at most 32) and easyfit's setting.
CONNECTIONS = ("CUDA_DEVICE_MAX_CONNECTIONS", "32")


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS tells it), at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1


def _backend_started() -> bool:
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - layout of a future JAX
        return False
    return bool(getattr(xla_bridge, "_backends", None))


def arrange_environment() -> bool:
    """Sets the command-buffer flag and the CUDA work queues when it is still in time.

    Returns:
        True when the command-buffer flag is in effect (set now or by the user), False when JAX
        had already started and a warning was issued.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    started = _backend_started()
    if not started:
        os.environ.setdefault(*CONNECTIONS)
    if "xla_gpu_enable_command_buffer" in flags:
        return True
    if started:
        import jax

        if any(d.platform == "gpu" for d in jax.devices()):
            warnings.warn(
                "easyfit was imported after JAX started its GPU backend, so it could not turn off "
                "XLA command buffers, which break beside DALI (nor give CUDA the work queues that "
                "keep DALI from waiting behind training). Import easyfit before using JAX, or set "
                f"XLA_FLAGS={_FLAG} {'='.join(CONNECTIONS)} in the environment.",
                RuntimeWarning,
                stacklevel=3,
            )
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}".strip()
    return True
