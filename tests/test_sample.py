"""The MNIST sample shipped in the package: small, licensed, the real images, usable offline."""

from __future__ import annotations

import hashlib
import os

import numpy as np

import easyfit as ef

SAMPLE_DIR = os.path.join(os.path.dirname(ef.__file__), "_sample")


def test_sample_is_small_and_carries_its_licence():
    assert os.path.getsize(os.path.join(SAMPLE_DIR, "mnist_sample.npz")) < 2_000_000
    with open(os.path.join(SAMPLE_DIR, "LICENSE-MNIST.txt")) as f:
        licence = f.read()
    for words in ("Yann LeCun", "Corinna Cortes", "Burges", "CC BY-SA 3.0"):
        assert words in licence


# sha256 of full MNIST's first 6,000 training / 1,000 test images (uint8 bytes) and labels
# (int32 bytes), computed once from the four official .gz files.
FIRST_IMAGES = {"train": "d3697039420594c3c374a633e530c66f54eca1e9a7687707ab97211c88c0ae9c",
                "val": "90c0bb6ad8af854fb44001355097fe1916cf1e24cf4a16225af42cf950b8a845"}


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
    assert np.array_equal(np.bincount(train.labels, minlength=10),
                          np.bincount(ef.datasets.sample()["train"][1][:120], minlength=10))
    assert ef.datasets.sample_folder(tmp_path / "s", limit=(120, 30)) == root  # reused as is
