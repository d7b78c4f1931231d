"""Writes full MNIST (60,000 + 10,000 images) for the benchmarks: an image folder or Caffe2 LMDBs.

    python benchmarks/make_data.py OUT [--format jpg|png|lmdb] [--source IDX_DIR]
        [--limit TRAIN,VAL]

``jpg``/``png``: OUT gets ``train/<digit>/<n>.<ext>`` and ``val/<digit>/<n>.<ext>`` (JPEG
quality 95, as the hand-written reference loop's data).

``lmdb``: OUT gets ``train/`` and ``val/``, two Caffe2 LMDBs laid out as reference program 1
reads them with ``fn.readers.caffe2`` (DALI_extra's ``db/MNIST/training`` and ``testing``):
one serialized ``TensorProtos`` per image, the JPEG (quality 95) as a ``STRING`` tensor and the
digit as an ``INT32`` tensor, keyed in MNIST's order. The LMDB writer is the one the tests use
(``tests/helpers/formats.py``). ``benchmarks/lmdb_loop.py`` is the hand-written loop for them.

The images come from ``ef.datasets.mnist_arrays``: the four gzipped IDX files in ``--source``,
or downloaded once into ``~/.cache/easyfit/mnist``. ``--limit`` keeps the first TRAIN and VAL
images (smoke tests). Prints the folder holding the IDX files (what ``scaling.py --model cnn``
reads). Needs Pillow (in the ``dev`` extra); ``lmdb`` is one of easyfit's dependencies.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

import easyfit as ef

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests/helpers
from tests.helpers.formats import encode, write_lmdb  # noqa: E402

CHUNK = 2000


def _write(job: tuple[str, str, int, np.ndarray, np.ndarray]) -> None:
    from PIL import Image

    root, ext, start, images, labels = job
    for i, (image, label) in enumerate(zip(images, labels)):
        path = os.path.join(root, str(label), f"{start + i:05d}.{ext}")
        Image.fromarray(image[..., 0]).save(path, **({"quality": 95} if ext == "jpg" else {}))


def _jpegs(images: np.ndarray) -> list[bytes]:
    return [encode(image, "jpeg", quality=95) for image in images]


def write_folder(out: str, data: dict, ext: str) -> None:
    """``out/{train,val}/<digit>/<n>.<ext>``, written by all cores."""
    jobs = []
    for split, (x, y) in data.items():
        root = os.path.join(out, split)
        for digit in range(10):
            os.makedirs(os.path.join(root, str(digit)), exist_ok=True)
        jobs += [(root, ext, s, x[s : s + CHUNK], y[s : s + CHUNK]) for s in range(0, len(x), CHUNK)]
    with ProcessPoolExecutor() as pool:
        list(pool.map(_write, jobs))


def write_lmdbs(out: str, data: dict) -> None:
    """``out/train`` and ``out/val``: Caffe2 LMDBs of JPEGs and labels (encoded by all cores)."""
    with ProcessPoolExecutor() as pool:
        for split, (x, y) in data.items():
            chunks = pool.map(_jpegs, [x[s : s + CHUNK] for s in range(0, len(x), CHUNK)])
            write_lmdb(os.path.join(out, split), [j for chunk in chunks for j in chunk], y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--format", choices=("jpg", "png", "lmdb"), default="jpg")
    ap.add_argument(
        "--source", default=None, help="folder with MNIST's four .gz IDX files (default: download once)"
    )
    ap.add_argument("--limit", default=None, help="TRAIN,VAL: keep the first images of each split")
    args = ap.parse_args()
    if os.path.isdir(args.out) and os.listdir(args.out):
        raise SystemExit(f"{args.out}: exists and is not empty; choose a new folder")
    data = ef.datasets.mnist_arrays(args.source)
    if args.limit:
        try:
            limits = dict(zip(("train", "val"), (int(n) for n in args.limit.split(",")), strict=True))
        except ValueError:
            raise SystemExit(f"--limit {args.limit}: expected TRAIN,VAL (two counts)") from None
        data = {split: (x[: limits[split]], y[: limits[split]]) for split, (x, y) in data.items()}
    if args.format == "lmdb":
        write_lmdbs(args.out, data)
    else:
        write_folder(args.out, data, args.format)
    idx = args.source or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "easyfit", "mnist"
    )
    what = "JPEGs in two Caffe2 LMDBs" if args.format == "lmdb" else f"{args.format} images"
    print(f"{args.out}: {sum(len(x) for x, _ in data.values())} {what}; IDX files in {idx}")


if __name__ == "__main__":
    main()
