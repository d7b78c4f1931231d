"""Shared fixtures: real MNIST images, from the sample shipped in easyfit (no network)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = Path(__file__).resolve().parent / "programs"
collect_ignore = ["programs"]


@pytest.fixture(scope="session")
def mnist_dir(tmp_path_factory) -> str:
    """MNIST as an image folder: 3,000 training and 500 validation PNGs of the sample."""
    import easyfit as ef

    return ef.datasets.sample_folder(tmp_path_factory.mktemp("mnist") / "mnist",
                                     limit=(3000, 500))


@pytest.fixture(scope="session")
def mnist_arrays():
    """The packaged sample: the first 6,000 training and 1,000 test images of MNIST."""
    import easyfit as ef

    return ef.datasets.sample()


@pytest.fixture(scope="session")
def mnist_idx(tmp_path_factory) -> str:
    """The sample as MNIST's four gzipped IDX files, for code that takes ``source=``."""
    from formats import write_idx_mnist

    import easyfit as ef

    return write_idx_mnist(tmp_path_factory.mktemp("idx"), ef.datasets.sample())


def run_program(name: str, *args: str, devices: int = 1, timeout: float = 600,
                env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs tests/programs/<name> in a fresh interpreter with ``devices`` CPU devices."""
    full_env = {**os.environ, **(env or {}),
                "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
                "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(PROGRAMS / name), *args], env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def last_json(proc: subprocess.CompletedProcess) -> dict:
    import json

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def flat_params(tree) -> np.ndarray:
    import jax

    return np.concatenate([np.asarray(a).ravel() for a in jax.tree_util.tree_leaves(tree)])


@pytest.fixture(scope="session")
def format_roots(tmp_path_factory, mnist_arrays) -> dict[str, str]:
    """MNIST (1,000 train / 300 val) as ``root/{train,val}`` in each reference format."""
    from formats import mnist_in

    base = tmp_path_factory.mktemp("formats")
    return {fmt: mnist_in(fmt, base / fmt, mnist_arrays, (1000, 300))
            for fmt in ("lmdb", "recordio", "tfrecord", "webdataset", "npy")}


@pytest.fixture(scope="module")
def trainer():
    """A SmallMLP Trainer shared by one module's tests, so its steps compile once."""
    import optax
    from models import SmallMLP

    import easyfit as ef

    return ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0)
