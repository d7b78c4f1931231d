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

And JAX's persistent compilation cache, on unless ``EASYFIT_COMPILATION_CACHE=0`` or the user
configured JAX's own (:func:`arrange_compilation_cache`): a re-run of an unchanged script reads
its compiled steps from disk instead of compiling them again.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from typing import Any

_FLAG = "--xla_gpu_enable_command_buffer="
_COMMAND_BUFFER = re.compile("xla_gpu_enable_command_buffer")  # the user's own value counts
#: CUDA's hardware work queues per device (CUDA's default 8, at most 32) and easyfit's setting.
CONNECTIONS = ("CUDA_DEVICE_MAX_CONNECTIONS", "32")


#: The off switch of easyfit's default compilation cache ("0", "false", "no", "off" or empty).
CACHE_SWITCH = "EASYFIT_COMPILATION_CACHE"
_OFF = ("0", "false", "no", "off", "")
_ON = ("1", "true", "yes", "on")
#: What easyfit sets where the user has not: every compilation is written, however short. The
#: start-up of a fit is the sum of many compilations (initialisation, the train and evaluation
#: steps, metrics, small eager operations); on a CPU or with a small model most take under JAX's
#: default of 1 s, and reading one back costs less than compiling it again.
CACHE_THRESHOLDS = {"jax_persistent_cache_min_compile_time_secs": 0.0}


def user_cache_dir(*parts: str) -> str:
    """``$XDG_CACHE_HOME/easyfit/<parts>``, or ``~/.cache/easyfit/<parts>`` where it is unset
    or not absolute (as the XDG base directory specification says)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "easyfit", *parts)


def _switched_on() -> bool:
    value = os.environ.get(CACHE_SWITCH)
    if value is None or value.strip().lower() in _ON:
        return True
    if value.strip().lower() in _OFF:
        return False
    warnings.warn(
        f"{CACHE_SWITCH}={value!r} is neither on (1, true, yes, on) nor off (0, false, no, off, "
        "or empty); the compilation cache stays on",
        RuntimeWarning,
        stacklevel=4,
    )
    return True


def _jax_option(name: str) -> Any:
    import jax

    return getattr(jax.config, name)  # options JAX adds at run time, unknown to type checkers


def compilation_cache() -> tuple[str | None, str]:
    """Where JAX's persistent compilation cache is in this process, and whose choice it is.

    Returns:
        ``(folder, why)``: the folder (None when the cache is off) and a few words on who
        decided, for ``easyfit info``.
    """
    folder = _jax_option("jax_compilation_cache_dir")
    if not _jax_option("jax_enable_compilation_cache"):
        return None, "off (jax_enable_compilation_cache is False)"
    if folder is None:
        why = f"off ({CACHE_SWITCH}={os.environ.get(CACHE_SWITCH)})" if not _switched_on() else "off"
        return None, why
    if folder == user_cache_dir("jax"):
        return folder, f"easyfit's default; {CACHE_SWITCH}=0 turns it off"
    return folder, "set by you (JAX_COMPILATION_CACHE_DIR or jax_compilation_cache_dir)"


def states_folder() -> str | None:
    """Where easyfit keeps initial training states (``easyfit.core.initial_states``), or
    None when they are not kept: on with the compilation cache (``EASYFIT_COMPILATION_CACHE``
    and JAX's ``jax_enable_compilation_cache``), in easyfit's folder even where the user put
    JAX's cache elsewhere."""
    on = bool(_jax_option("jax_enable_compilation_cache")) and _switched_on()
    return user_cache_dir("states") if on else None


def arrange_compilation_cache() -> str | None:
    """Turns JAX's persistent compilation cache on in the per-user cache folder.

    Leaves JAX alone where the user configured its cache (``JAX_COMPILATION_CACHE_DIR`` or
    ``jax_compilation_cache_dir``) or turned it off (``jax_enable_compilation_cache``), and
    where ``EASYFIT_COMPILATION_CACHE`` is off. Sets :data:`CACHE_THRESHOLDS` unless the user
    set them in the environment. In time whenever it runs before the first compilation that
    should be cached: JAX opens the folder at the first compilation that finds one set.

    Returns:
        The folder easyfit chose, or None when it chose none.
    """
    import jax

    theirs = _jax_option("jax_compilation_cache_dir") is not None
    if theirs or not _jax_option("jax_enable_compilation_cache") or not _switched_on():
        return None
    folder = user_cache_dir("jax")
    jax.config.update("jax_compilation_cache_dir", folder)
    for name, value in CACHE_THRESHOLDS.items():
        if name.upper() not in os.environ:
            jax.config.update(name, value)
    return folder


#: What ``Trainer(deterministic=True)`` adds to ``XLA_FLAGS``: XLA:GPU then uses deterministic
#: implementations of scatter, select-and-scatter, GEMMs and convolutions, and picks kernels
#: without timing candidates (autotuning would pick by measurements that vary between runs).
DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"
_DETERMINISTIC = re.compile(r"--xla_gpu_deterministic_ops(=(true|1))?(\s|$)", re.IGNORECASE)


def arrange_determinism() -> bool:
    """Adds :data:`DETERMINISTIC_FLAG` to ``XLA_FLAGS`` while JAX's backend has not started (XLA
    reads the flags when the backend starts), keeping every flag already there.

    Returns:
        True when the flag is in effect (set now or by the user); False when the backend had
        started without it, after a warning (on a GPU the run may then not repeat bit for bit;
        on a CPU it does anyway).
    """
    message = (
        "Trainer(deterministic=True) came after JAX started its backend, so it could not add "
        f"{DETERMINISTIC_FLAG} to XLA_FLAGS: on a GPU, this run may not repeat bit for bit "
        "(on a CPU it does anyway). Create the Trainer before anything uses JAX, or start "
        f"Python with XLA_FLAGS={DETERMINISTIC_FLAG} in the environment."
    )
    return _add_flag(DETERMINISTIC_FLAG, _DETERMINISTIC, message, gpu_only=False)


def _add_flag(flag: str, present: re.Pattern[str], message: str, *, gpu_only: bool) -> bool:
    """Appends ``flag`` to ``XLA_FLAGS`` unless ``present`` finds it there already; once JAX's
    backend has started, warns ``message`` instead (only on a GPU where ``gpu_only``), pointing
    at the code two calls above (the caller's caller)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if present.search(flags):
        return True
    if _backend_started():
        import jax

        if not gpu_only or any(d.platform == "gpu" for d in jax.devices()):
            warnings.warn(message, RuntimeWarning, stacklevel=4)
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
    return True


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
    """Sets the command-buffer flag and the CUDA work queues when it is still in time, and
    turns the compilation cache on (:func:`arrange_compilation_cache`).

    Returns:
        True when the command-buffer flag is in effect (set now or by the user), False when JAX
        had already started and a warning was issued.
    """
    if not _backend_started():
        os.environ.setdefault(*CONNECTIONS)
    arrange_compilation_cache()
    message = (
        "easyfit was imported after JAX started its GPU backend, so it could not turn off "
        "XLA command buffers, which break beside DALI (nor give CUDA the work queues that "
        "keep DALI from waiting behind training). Import easyfit before using JAX, or set "
        f"XLA_FLAGS={_FLAG} {'='.join(CONNECTIONS)} in the environment."
    )
    return _add_flag(_FLAG, _COMMAND_BUFFER, message, gpu_only=True)
