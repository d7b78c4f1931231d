"""Initial training states kept on disk: a re-run of an unchanged script reads the state its
seed gave last time instead of lowering, loading and running the initialisation again, which
is a large part of a warm start-up (docs/performance.md).

A state initialised on a CPU device is a pure function of what this module hashes into its key:
the initialisation's program as JAX traced it (its jaxpr, printed in full, and its constants),
its arguments' values (the seed's keys, the example input), JAX's configuration, the versions
of the libraries that trace and compile it, XLA's flags and options, and the CPU that runs it.
Any change to the model, the optimizer, the seed or the software is a different key: a new
entry, computed and kept. An entry is one ``.npy`` file of bytes: the state's leaves in order,
each at an offset aligned to 64 bytes, then the CRC-32C of those bytes. It is written to a
temporary name and renamed (another process sees it whole or not at all), and read only when
its header's size is the file's and the state's, and its CRC matches; anything else is a miss
(a warning, and the state computed anew), never an error.

A state sharded across processes (``Trainer(sharding=)`` under ``jax.distributed``) is kept
per process: each process's entry holds the parts of the state its own devices hold, keyed by
the state's key and those parts' bounds (:func:`shard_key`), and the processes read theirs back
only when every one of them can (else they all compute the state, one program for all).

On whenever easyfit's compilation cache is (``EASYFIT_COMPILATION_CACHE=0`` turns both off),
in ``$XDG_CACHE_HOME/easyfit/states`` (``~/.cache/easyfit/states``); the least recently used
entries go once the folder holds more than :data:`MAX_BYTES`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import platform
import re
import tempfile
import time
from importlib import metadata
from typing import Any

import google_crc32c
import jax
import numpy as np

from .._env import states_folder
from .._links import DISTRIBUTION

__all__ = ["MAX_BYTES", "folder", "read", "shard_key", "state_key", "write"]

log = logging.getLogger("easyfit")

#: The folder's cap in bytes: after an entry is written, the least recently used others are
#: removed until the folder holds at most this much, room for the states of several large models.
#: A state larger than this is not kept.
MAX_BYTES = 2 << 30

_FORMAT = b"easyfit initial state 1"
_SUFFIX = ".npy"
_ALIGN = 64  # each leaf's offset in an entry: its view is aligned for any dtype
_WRITING = ".writing-"  # an entry's temporary name, until it is whole
_STALE_SECONDS = 3600.0  # a temporary file this old is no process's any more
_ENTRY = re.compile(r"[0-9a-f]{64}\.npy")  # a key (state_key's SHA-256) and the suffix
_TEMPORARY = re.compile(r"\.writing-[A-Za-z0-9_]+\.npy")  # tempfile.mkstemp's names
#: Distributions whose versions are in the key (easyfit's by its name on the package index).
_LIBRARIES = (DISTRIBUTION, "jax", "jaxlib", "flax", "optax", "numpy", "ml_dtypes")


folder = states_folder  #: the folder of kept states, or None where easyfit's start-up caches are off


def state_key(
    traced: jax.stages.Traced, args: tuple[Any, ...], device: jax.Device, options: dict[str, Any]
) -> str:
    """The key of the state ``traced`` (the jitted initialisation, traced for ``args``) gives
    on ``device`` (a CPU device), compiled with XLA ``options``."""
    h = hashlib.sha256(_FORMAT)

    def add(*parts: Any) -> None:
        for part in parts:
            data = part if isinstance(part, bytes) else repr(part).encode()
            h.update(len(data).to_bytes(8, "little") + data)

    closed = traced.jaxpr
    add(str(closed))
    for value in [*closed.consts, *jax.tree_util.tree_leaves(args)]:
        if jax.dtypes.issubdtype(getattr(value, "dtype", None), jax.dtypes.prng_key):
            value = jax.random.key_data(value)
        array = np.asarray(value)
        add(array.dtype.str, array.dtype.name, array.shape, np.ascontiguousarray(array).tobytes())
    add(sorted(jax.config.values.items()), sorted(options.items()), os.environ.get("XLA_FLAGS", ""))
    add([(name, _version(name)) for name in _LIBRARIES])
    add(device.platform, device.device_kind, device.client.platform_version, _cpu())
    return h.hexdigest()


def shard_key(key: str, pieces: list[tuple[int, tuple[tuple[int, int], ...]]]) -> str:
    """The key of the parts of the state of ``key`` that one process holds when the state is
    sharded across processes: ``pieces`` are ``(leaf, bounds)``, a leaf's index in the state's
    leaves and a part's ``(start, stop)`` per dimension. A part's values are those of the whole
    state there, whatever the layout, so processes holding the same parts share an entry."""
    return hashlib.sha256(f"{key} shards {pieces!r}".encode()).hexdigest()


def read(key: str, abstract: list[jax.ShapeDtypeStruct]) -> list[np.ndarray] | None:
    """The kept state of ``key`` as host arrays shaped as ``abstract`` (the state's leaves in
    order), or None: none kept, or one not whole (its CRC-32C) or not of those shapes."""
    where = folder()
    if where is None:
        return None
    path = os.path.join(where, key + _SUFFIX)
    try:
        offsets, size = _layout(abstract)
        payload = _payload(path, size + 4)
        if google_crc32c.value(payload[:size]) != int.from_bytes(payload[size:].tobytes(), "little"):
            raise ValueError("its CRC-32C does not match its bytes")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError, MemoryError) as e:
        log.warning("easyfit: the kept initial state %s is damaged (%s): initialising anew", path, e)
        return None
    try:
        os.utime(path)  # recently used: the last to go when the folder is trimmed
    except OSError:  # another's entry, or removed meanwhile: read all the same
        pass
    log.info("easyfit: initial state read from %s", path)
    return [
        payload[start : start + _nbytes(spec)].view(spec.dtype).reshape(spec.shape)
        for start, spec in zip(offsets, abstract, strict=True)
    ]


def _payload(path: str, expected: int) -> np.ndarray:
    """An entry's bytes, read once its ``.npy`` header says what the file holds, ``expected``
    uint8: a header that claims another size (a damaged one may claim a TiB) is refused
    before anything is allocated for it."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version != (1, 0):  # what np.save writes for an entry's one-line header
            raise ValueError(f".npy format version {version[0]}.{version[1]}, not 1.0")
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        claimed = math.prod(shape) * dtype.itemsize
        held = os.fstat(f.fileno()).st_size - f.tell()
        if claimed != held:
            raise ValueError(f"its header claims {claimed} bytes of data, the file holds {held}")
        if dtype != np.uint8 or shape != (expected,):
            raise ValueError(f"{shape} {dtype} bytes where ({expected},) uint8 were expected")
        payload = np.fromfile(f, np.uint8, count=expected)
    if len(payload) != expected:  # cut short while it was read
        raise EOFError(f"{len(payload)} of its {expected} bytes could be read")
    return payload


def write(key: str, leaves: list[np.ndarray]) -> None:
    """Keeps ``leaves`` (the state's, on the host) as the state of ``key``, then trims the
    folder to :data:`MAX_BYTES`. A failure to write is logged, never raised: the fit goes on."""
    where = folder()
    offsets, size = _layout(leaves)
    if where is None or size > MAX_BYTES:
        return
    payload = np.zeros(size + 4, np.uint8)
    for start, leaf in zip(offsets, leaves, strict=True):
        payload[start : start + leaf.nbytes] = np.ascontiguousarray(leaf).reshape(-1).view(np.uint8)
    payload[size:] = np.frombuffer(google_crc32c.value(payload[:size]).to_bytes(4, "little"), np.uint8)
    try:
        os.makedirs(where, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=_WRITING, suffix=_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, payload)
            os.replace(tmp, os.path.join(where, key + _SUFFIX))  # whole or not at all
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        _trim(where, keep=key + _SUFFIX)
    except OSError as e:
        log.warning("easyfit: could not keep the initial state in %s (%s)", where, e)


def _nbytes(spec: Any) -> int:
    return int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize


def _layout(leaves: list[Any]) -> tuple[list[int], int]:
    """Each leaf's offset in an entry's bytes (aligned to :data:`_ALIGN`) and their end."""
    offsets, end = [], 0
    for leaf in leaves:
        end = -(-end // _ALIGN) * _ALIGN
        offsets.append(end)
        end += _nbytes(leaf)
    return offsets, end


def _trim(where: str, keep: str) -> None:
    """Removes the least recently used entries (never ``keep``) until the folder holds at most
    :data:`MAX_BYTES`, and what a process killed while writing left (a temporary file older
    than :data:`_STALE_SECONDS`); files another process removes meanwhile are skipped."""
    entries = []
    now = time.time()
    for entry in os.scandir(where):
        ours, writing = _ENTRY.fullmatch(entry.name), _TEMPORARY.fullmatch(entry.name)
        if not (ours or writing):  # only what this module names: never another file here
            continue
        try:
            stat = entry.stat()
            if writing and now - stat.st_mtime > _STALE_SECONDS:
                os.remove(entry.path)
        except FileNotFoundError:
            continue
        if ours:
            entries.append((stat.st_mtime, stat.st_size, entry.path, entry.name))
    total = sum(size for _, size, _, _ in entries)
    for _, size, path, name in sorted(entries):
        if total <= MAX_BYTES:
            break
        if name == keep:
            continue
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        total -= size


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


def _cpu() -> str:
    """The host CPU's model and features (XLA compiles a CPU program for them)."""
    wanted = ("model name", "flags", "Features", "CPU implementer", "CPU part")
    try:
        with open("/proc/cpuinfo") as f:
            lines = sorted({line.strip() for line in f if line.split(":")[0].strip() in wanted})
    except OSError:
        lines = []
    return "\n".join([platform.machine(), platform.processor(), *lines])
