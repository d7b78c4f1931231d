"""The MNIST sample shipped in the package: small, licensed, the real images, usable offline."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

import easyfit as ef
from tests.helpers import ROOT

SAMPLE_DIR = os.path.join(os.path.dirname(ef.__file__), "_sample")


def test_sample_is_small_and_carries_its_licence():
    assert os.path.getsize(os.path.join(SAMPLE_DIR, "mnist_sample.npz")) < 2_000_000
    with open(os.path.join(SAMPLE_DIR, "LICENSE-MNIST.txt")) as f:
        licence = f.read()
    for words in ("Yann LeCun", "Corinna Cortes", "Burges", "CC BY-SA 3.0"):
        assert words in licence


# sha256 of full MNIST's first 6,000 training / 1,000 test images (uint8 bytes) and labels
# (int32 bytes), computed once from the four official .gz files.
FIRST_IMAGES = {
    "train": "d3697039420594c3c374a633e530c66f54eca1e9a7687707ab97211c88c0ae9c",
    "val": "90c0bb6ad8af854fb44001355097fe1916cf1e24cf4a16225af42cf950b8a845",
}


def test_sample_holds_the_first_mnist_images():
    sample = ef.datasets.sample()
    for split, (x, y) in sample.items():
        assert x.dtype == np.uint8 and y.dtype == np.int32 and x.shape[1:] == (28, 28, 1)
        digest = hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()
        assert digest == FIRST_IMAGES[split]
        assert set(np.unique(y)) == set(range(10))
    assert (len(sample["train"][0]), len(sample["val"][0])) == (6000, 1000)


def test_sample_folder_reads_back_through_dali(tmp_path):
    root = ef.datasets.sample_folder(tmp_path / "s", limit=(120, 30))
    train = ef.data.ImageFolder(os.path.join(root, "train"))
    assert len(train) == 120 and train.image_shape == (28, 28, 1)
    assert np.array_equal(
        np.bincount(train.labels, minlength=10),
        np.bincount(ef.datasets.sample()["train"][1][:120], minlength=10),
    )
    assert ef.datasets.sample_folder(tmp_path / "s", limit=(120, 30)) == root  # reused as is


# Without a network, ef.datasets.mnist() says what to do instead of a urllib traceback.

_PROGRAM = """
import easyfit as ef
try:
    ef.datasets.mnist("digits", limit=(10, 10))
except ef.DataError as e:
    print("DataError:", e)
else:
    print("downloaded")
"""


@pytest.mark.slow
def test_mnist_without_network_names_the_sample_and_source(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "EASYFIT_MNIST_DIR"}
    env.update(
        EASYFIT_MNIST_MIRROR="http://127.0.0.1:9/",
        XDG_CACHE_HOME=str(tmp_path / "c"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    proc = subprocess.run(
        [sys.executable, "-c", _PROGRAM], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("DataError: could not download MNIST from http://127.0.0.1:9/"), out
    assert "ef.datasets.sample_folder(" in out and "source=" in out
    assert "Traceback" not in proc.stderr
    assert not [f for f in os.listdir(tmp_path / "c" / "easyfit" / "mnist")]  # no partial file
