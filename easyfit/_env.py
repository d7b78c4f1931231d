"""Process environment easyfit arranges before JAX starts its backend.

DALI's JAX outputs and XLA's CUDA-graph command buffers do not mix (with DALI 2.4 and JAX 0.11,
cuBLAS fails with "internal operation failed" and XLA with "Failed to destroy CUDA graph").
Turning command buffers off costs nothing measurable for data-parallel training, so easyfit does
it for its users: at import, if JAX's backend has not started yet, it adds
``--xla_gpu_enable_command_buffer=`` to ``XLA_FLAGS`` (unless the user already set that flag).
If the backend has already started, it warns once with what to do.
"""

from __future__ import annotations

import os
import sys
import warnings

_FLAG = "--xla_gpu_enable_command_buffer="


def _backend_started() -> bool:
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - layout of a future JAX
        return False
    return bool(getattr(xla_bridge, "_backends", None))


def arrange_xla_flags() -> bool:
    """Adds the command-buffer flag to ``XLA_FLAGS`` when it is still in time.

    Returns:
        True when the flag is in effect (set now or by the user), False when JAX had already
        started and a warning was issued.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_gpu_enable_command_buffer" in flags:
        return True
    if _backend_started():
        import jax

        if any(d.platform == "gpu" for d in jax.devices()):
            warnings.warn(
                "easyfit was imported after JAX started its GPU backend, so it could not turn off "
                "XLA command buffers, which break beside DALI. Import easyfit before using JAX, "
                f"or set XLA_FLAGS={_FLAG} in the environment.",
                RuntimeWarning,
                stacklevel=3,
            )
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}".strip()
    return True
