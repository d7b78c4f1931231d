"""Writes the MNIST sample that ships inside the package (``easyfit/_sample/mnist_sample.npz``).

    python tools/make_sample.py [--mnist IDX_DIR] [--train 6000] [--val 1000]

The sample is the first ``--train`` images of MNIST's training set and the first ``--val`` of
its test set (``--mnist``: a folder with MNIST's four gzipped IDX files; without it they are
downloaded once into ``~/.cache/easyfit/mnist``), as uint8 ``(n, 28, 28, 1)`` images and int32
labels, in one compressed NumPy archive (no pickle). ``easyfit.datasets.sample()`` reads it
back; ``easyfit demo`` trains on it.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from easyfit.datasets import mnist_arrays  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--mnist", default=None, help="folder with MNIST's four gzipped IDX files (default: download once)"
    )
    ap.add_argument("--train", type=int, default=6000)
    ap.add_argument("--val", type=int, default=1000)
    ap.add_argument("--out", default=os.path.join(ROOT, "easyfit", "_sample", "mnist_sample.npz"))
    args = ap.parse_args()
    data = mnist_arrays(args.mnist)
    (x, y), (xv, yv) = data["train"], data["val"]
    np.savez_compressed(
        args.out, x_train=x[: args.train], y_train=y[: args.train], x_val=xv[: args.val], y_val=yv[: args.val]
    )
    counts = np.bincount(y[: args.train], minlength=10).tolist()
    print(
        f"{args.out}: {os.path.getsize(args.out) / 1e6:.2f} MB, "
        f"{args.train} + {args.val} images, training images per digit {counts}"
    )


if __name__ == "__main__":
    main()
