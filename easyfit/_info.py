"""``easyfit info``: versions, backend and devices, and the known bad combinations among them.

``collect`` reads the environment; ``problems`` is a pure function of what it read, so
each known bad combination can be checked on its own.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from ._env import _FLAG, CONNECTIONS, compilation_cache, states_folder
from ._links import DISTRIBUTION

__all__ = ["Environment", "collect", "problems", "report"]

DALI = "nvidia-dali"
_SHOWN = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    DALI,
    "clu",
    "orbax-checkpoint",
    "numpy",
    "tqdm",
    "matplotlib",
    "pyarrow",
)
_JAX_CUDA = re.compile(r"^jax-cuda(\d+)-(plugin|pjrt)$")
_DALI_DIST = re.compile(r"^nvidia-dali(?:-cuda(\d\d)\d?)?$")


@dataclasses.dataclass(frozen=True)
class Environment:
    """What ``easyfit info`` reports.

    Attributes:
        python: the interpreter's version (``"3.11.9"``).
        versions: installed versions by distribution name (``"nvidia-dali"`` for any DALI
            build); None where missing.
        dali_dist: the DALI distribution installed (``"nvidia-dali-cuda120"``), or None.
        dali_cuda: CUDA major version DALI was built for, when known.
        jax_cuda: CUDA major version of JAX's CUDA plugin, when one is installed.
        requirements: easyfit's own requirements (``"jax>=0.4.30"``, ...), from its metadata.
        requires_python: easyfit's ``Requires-Python``.
        backend: JAX's default backend (``"cpu"``, ``"gpu"``, ...), or ``"failed: <why>"``.
        devices: one description per device.
        process_count: JAX processes (hosts) taking part.
        xla_flags: ``XLA_FLAGS`` as this process sees it.
        connections: ``CUDA_DEVICE_MAX_CONNECTIONS`` as this process sees it ("" when unset).
        gpu_present: an NVIDIA GPU device node exists on this machine.
        compilation_cache: JAX's persistent compilation cache: its folder and whose choice it
            is, or why it is off.
        initial_states: the folder easyfit keeps initial training states in, or why none.
        s3_endpoint: the S3 endpoint the AWS variables name (``AWS_ENDPOINT_URL_S3`` or
            ``AWS_ENDPOINT_URL``; "" for AWS itself): where ``s3://`` data is read from.
        other_easyfit: the version of a distribution named ``easyfit`` installed too (the
            other project of that name on the package index, or easyfit from before its
            distribution was named easyfit-flax), else None: its files share the import name.
    """

    python: str
    versions: dict[str, str | None]
    dali_dist: str | None = None
    dali_cuda: int | None = None
    jax_cuda: int | None = None
    requirements: tuple[str, ...] = ()
    requires_python: str | None = None
    backend: str = "cpu"
    devices: tuple[str, ...] = ()
    process_count: int = 1
    xla_flags: str = ""
    connections: str = ""
    gpu_present: bool = False
    compilation_cache: str = ""
    initial_states: str = ""
    s3_endpoint: str = ""
    other_easyfit: str | None = None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _installed() -> list[str]:
    return sorted({canonicalize_name(d.metadata["Name"] or "") for d in metadata.distributions()})


def _dali() -> tuple[str | None, str | None, int | None]:
    """(distribution, version, CUDA major) of the DALI that imports, else what is installed."""
    dist = next((n for n in _installed() if _DALI_DIST.match(n)), None)
    cuda = None
    try:
        import nvidia.dali as dali
        from nvidia.dali import backend
    except ImportError:
        return dist, None, None
    built = getattr(backend, "__cuda_version__", 0)  # e.g. 12986 for CUDA 12.9
    if built:
        cuda = int(built) // 1000
    elif dist and (m := _DALI_DIST.match(dist)) and m.group(1):
        cuda = int(m.group(1))
    return dist, dali.__version__, cuda


def _devices() -> tuple[str, tuple[str, ...], int]:
    import jax

    try:
        devices = jax.devices()
    except RuntimeError as e:
        return f"failed: {str(e).splitlines()[0]}", (), 1
    return (
        jax.default_backend(),
        tuple(f"{d.platform}:{d.id} {d.device_kind}" for d in devices),
        jax.process_count(),
    )


def collect() -> Environment:
    """Reads versions, easyfit's requirements, JAX's backend and devices from this process."""
    from . import __version__

    dali_dist, dali_version, dali_cuda = _dali()
    versions = {"easyfit": __version__, **{n: dali_version if n == DALI else _version(n) for n in _SHOWN}}
    versions["boto3"] = _version("boto3")
    jax_cuda = next((int(m.group(1)) for n in _installed() if (m := _JAX_CUDA.match(n))), None)
    try:
        requirements = tuple(metadata.requires(DISTRIBUTION) or ())
        requires_python = metadata.metadata(DISTRIBUTION)["Requires-Python"]
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        requirements, requires_python = (), None
    for line in requirements:  # what problems() checks: every requirement's version
        name = canonicalize_name(Requirement(line).name)
        if not name.startswith(DALI):
            versions.setdefault(name, _version(name))
    backend, devices, processes = _devices()
    cache_folder, cache_why = compilation_cache()
    return Environment(
        python=platform.python_version(),
        versions=versions,
        dali_dist=dali_dist,
        dali_cuda=dali_cuda,
        jax_cuda=jax_cuda,
        requirements=requirements,
        requires_python=requires_python,
        backend=backend,
        devices=devices,
        process_count=processes,
        xla_flags=os.environ.get("XLA_FLAGS", ""),
        connections=os.environ.get(CONNECTIONS[0], ""),
        gpu_present=os.path.exists("/dev/nvidia0"),
        compilation_cache=f"{cache_folder} ({cache_why})" if cache_folder else cache_why,
        initial_states=states_folder() or "off (with the compilation cache)",
        s3_endpoint=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL", ""),
        other_easyfit=_version("easyfit"),
    )


def _requirement_problems(env: Environment) -> list[str]:
    found = []
    for line in env.requirements:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an optional extra
        name = canonicalize_name(req.name)
        is_dali = name.startswith(DALI)
        installed = env.versions.get(DALI if is_dali else name)
        if installed is None:
            if not is_dali:  # DALI has its own message
                found.append(f"{name} is not installed; easyfit needs {req}")
        elif not req.specifier.contains(installed, prereleases=True):
            found.append(f"{name} {installed} is too old: easyfit needs {name}{req.specifier}")
    return found


def problems(env: Environment) -> list[str]:
    """The known bad combinations in ``env``, one sentence each (with what to do).

    Example:
        >>> from easyfit._info import Environment, problems
        >>> env = Environment(python="3.11.9", versions={"nvidia-dali": "2.4.0"}, backend="gpu",
        ...                   xla_flags="", dali_cuda=12, jax_cuda=13)
        >>> for line in problems(env):
        ...     print(line.split(":")[0])
        JAX runs on the GPU without --xla_gpu_enable_command_buffer= in XLA_FLAGS
        DALI was built for CUDA 12 but JAX's CUDA plugin is for CUDA 13
    """
    found = []
    if env.requires_python and not SpecifierSet(env.requires_python).contains(env.python, prereleases=True):
        found.append(f"Python {env.python} is too old: easyfit needs Python{env.requires_python}")
    found += _requirement_problems(env)
    if env.other_easyfit is not None:
        found.append(
            f"the distribution easyfit {env.other_easyfit} is installed too: on the package index "
            f"easyfit is another project (pip install easyfit installs it), whose files share the "
            f"import name easyfit. pip uninstall easyfit, then install {DISTRIBUTION} again "
            "(pip install -e . in its clone)"
        )
    if env.versions.get(DALI) is None:
        found.append(
            "NVIDIA DALI is not installed (or does not import): easyfit reads every "
            "batch through it. pip install nvidia-dali-cuda120 (or nvidia-dali-cuda130, "
            "to match your CUDA)"
        )
    if env.backend.startswith("failed"):
        found.append(f"JAX could not start its backend ({env.backend[8:]})")
    if env.backend == "gpu" and not re.search(re.escape(_FLAG) + r"(\s|$)", env.xla_flags):
        found.append(
            f"JAX runs on the GPU without {_FLAG} in XLA_FLAGS: XLA's command buffers "
            "break beside DALI. Import easyfit before JAX starts, or export "
            f"XLA_FLAGS={_FLAG}"
        )
    if env.dali_cuda and env.jax_cuda and env.dali_cuda != env.jax_cuda:
        found.append(
            f"DALI was built for CUDA {env.dali_cuda} but JAX's CUDA plugin is for "
            f"CUDA {env.jax_cuda}: install nvidia-dali-cuda{env.jax_cuda}0 or "
            f"jax[cuda{env.dali_cuda}]"
        )
    if env.backend == "cpu" and env.gpu_present:
        found.append(
            "this machine has an NVIDIA GPU but JAX runs on the CPU: "
            'pip install -U "jax[cuda12]" (or jax[cuda13]) for JAX to use it'
        )
    return found


def _s3(env: Environment) -> str:
    """Whether ``s3://`` paths can be read: boto3 lists and checks the objects, DALI reads them."""
    boto3 = env.versions.get("boto3")
    if boto3 is None:
        return "not available: boto3 is not installed (pip install 'easyfit-flax[s3]')"
    return f"available (boto3 {boto3}; endpoint {env.s3_endpoint or 'AWS'})"


def _sharding(devices: int) -> str:
    """What ``Trainer(sharding=)`` does with this process's devices (its default in force)."""
    from .core.sharding import MIN_BYTES

    if devices < 2:
        return "replicated (one device: Trainer(sharding=) has nothing to split)"
    return (
        f"replicated by default; Trainer(sharding='zero1' or 'fsdp') splits arrays over "
        f"{MIN_BYTES >> 20} MiB {devices} ways"
    )


def report(env: Environment) -> str:
    """``easyfit info``'s text: versions, backend, devices, then warnings."""
    v = env.versions
    dali = v.get(DALI) or "not installed"
    if v.get(DALI):
        dali += f" ({env.dali_dist or 'nvidia-dali'}"
        dali += f", built for CUDA {env.dali_cuda})" if env.dali_cuda else ")"
    kinds: dict[str, int] = {}
    for d in env.devices:
        kinds[d.split(" ", 1)[1]] = kinds.get(d.split(" ", 1)[1], 0) + 1
    rows = [
        ("easyfit", v.get("easyfit")),
        ("python", f"{env.python} ({sys.executable})"),
        (
            "jax",
            f"{v.get('jax')} (jaxlib {v.get('jaxlib')}"
            + (f", CUDA {env.jax_cuda} plugin)" if env.jax_cuda else ")"),
        ),
        ("flax", v.get("flax")),
        ("optax", v.get("optax")),
        ("dali", dali),
        *((n, v.get(n) or "not installed") for n in _SHOWN[5:]),
        ("backend", env.backend),
        ("devices", ", ".join(f"{n} x {k}" for k, n in kinds.items()) or "none"),
        ("processes", str(env.process_count)),
        ("sharding", _sharding(len(env.devices))),
        ("XLA_FLAGS", env.xla_flags or "(not set)"),
        (CONNECTIONS[0], env.connections or "(not set)"),
        ("jax_compilation_cache_dir", env.compilation_cache or "(not known)"),
        ("initial_states", env.initial_states or "(not known)"),
        ("s3://", _s3(env)),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]  # one column of values
    found = problems(env)
    lines += [f"warning: {p}" for p in found] or ["no known problems"]
    return "\n".join(lines)
