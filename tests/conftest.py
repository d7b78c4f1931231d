"""Shared fixtures: real MNIST images written from ../shared/datasets/mnist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
MNIST_IDX = ROOT.parent / "shared" / "datasets" / "mnist"
PROGRAMS = Path(__file__).resolve().parent / "programs"
collect_ignore = ["programs"]


def _need_mnist() -> None:
    if not (MNIST_IDX / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"MNIST not found at {MNIST_IDX}")


@pytest.fixture(scope="session")
def mnist_dir(tmp_path_factory) -> str:
    """MNIST as an image folder: 3,000 training and 500 validation PNGs."""
    _need_mnist()
    import easyfit as ef

    return ef.datasets.mnist(tmp_path_factory.mktemp("mnist") / "mnist", limit=(3000, 500),
                             source=MNIST_IDX)


@pytest.fixture(scope="session")
def mnist_arrays():
    _need_mnist()
    import easyfit as ef

    return ef.datasets.mnist_arrays(MNIST_IDX)


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
