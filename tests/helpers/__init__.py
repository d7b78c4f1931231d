"""Helpers the tests share; the fixtures are in the repository's one conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "programs"
#: XLA's backend optimisations off, for programs whose output does not depend on how fast their
#: compiled steps run (the docs' code blocks, the examples): compiling is most of a short
#: program's time on a CPU. The rest of the suite compiles as users do.
QUICK_COMPILE = "--xla_backend_optimization_level=0"


def run_program(
    name: str, *args: str, devices: int = 1, timeout: float = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Runs tests/programs/<name> in a fresh interpreter with ``devices`` CPU devices and this
    checkout first on the path (not whichever easyfit is installed)."""
    full_env = {
        **os.environ,
        **(env or {}),
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, str(PROGRAMS / name), *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_python(*argv: str, cwd=None, devices: int = 1) -> str:
    """``python *argv`` in a fresh interpreter with this checkout first on the path and
    ``devices`` CPU devices; its stdout, after asserting that it succeeded."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def last_json(proc: subprocess.CompletedProcess) -> dict:
    """The JSON object a program printed last; its output when it failed."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def untrained(trainer):
    """``trainer`` as a new Trainer of the same arguments would be, its compiled steps kept: no
    state (the next fit or evaluate initialises it from the seed, as the first did) and not
    stopping. Lets a module share one trainer's compilation without its tests depending on what
    the tests before them trained."""
    trainer.state, trainer.stop_training = None, False
    return trainer


def flat_params(tree) -> np.ndarray:
    """Every leaf of ``tree``, flattened into one array."""
    import jax

    return np.concatenate([np.asarray(a).ravel() for a in jax.tree_util.tree_leaves(tree)])


class Crash(RuntimeError):
    """What :func:`crash_at`'s callback raises."""


def crash_at(trainer, epoch: int, batch: int):
    """A callback that raises :class:`Crash` at the end of ``batch`` of ``epoch`` of
    ``trainer``'s fit (a dispatch index), as a killed run would stop there: before
    BackupAndRestore's hook of that batch (it runs after the other callbacks there), so the last
    backup is of an earlier batch."""
    from easyfit.callbacks import LambdaCallback

    def crash(b, logs):
        if trainer.progress.epoch == epoch and b == batch:
            raise Crash

    return LambdaCallback(on_train_batch_end=crash)


def crash_before(trainer, epoch: int, batch: int):
    """A callback that raises :class:`Crash` as ``batch`` of ``epoch`` of ``trainer``'s fit
    begins: a run killed after the batch before, every hook of it done (its backup too)."""
    from easyfit.callbacks import LambdaCallback

    def crash(b, logs):
        if trainer.progress.epoch == epoch and b == batch:
            raise Crash

    return LambdaCallback(on_train_batch_begin=crash)
