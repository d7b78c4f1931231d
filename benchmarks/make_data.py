"""Writes full MNIST (60,000 + 10,000 images) as an image folder for the benchmarks.

    python benchmarks/make_data.py OUT [--format jpg|png] [--source IDX_DIR]

OUT gets ``train/<digit>/<n>.<ext>`` and ``val/<digit>/<n>.<ext>`` (JPEG quality 95, as the
hand-written reference loop's data). The images come from ``ef.datasets.mnist_arrays``: the
four gzipped IDX files in ``--source``, or downloaded once into ``~/.cache/easyfit/mnist``.
Prints the folder holding the IDX files (what ``scaling.py --model cnn`` reads). Needs Pillow
(in the ``dev`` extra).
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

import easyfit as ef


def _write(job: tuple[str, str, int, np.ndarray, np.ndarray]) -> None:
    from PIL import Image

    root, ext, start, images, labels = job
    for i, (image, label) in enumerate(zip(images, labels)):
        path = os.path.join(root, str(label), f"{start + i:05d}.{ext}")
        Image.fromarray(image[..., 0]).save(path, **({"quality": 95} if ext == "jpg" else {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--format", choices=("jpg", "png"), default="jpg")
    ap.add_argument(
        "--source", default=None, help="folder with MNIST's four .gz IDX files (default: download once)"
    )
    args = ap.parse_args()
    if os.path.isdir(args.out) and os.listdir(args.out):
        raise SystemExit(f"{args.out}: exists and is not empty; choose a new folder")
    data = ef.datasets.mnist_arrays(args.source)
    jobs = []
    for split, (x, y) in data.items():
        root = os.path.join(args.out, split)
        for digit in range(10):
            os.makedirs(os.path.join(root, str(digit)), exist_ok=True)
        jobs += [(root, args.format, s, x[s : s + 2000], y[s : s + 2000]) for s in range(0, len(x), 2000)]
    with ProcessPoolExecutor() as pool:
        list(pool.map(_write, jobs))
    idx = args.source or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "easyfit", "mnist"
    )
    print(f"{args.out}: {sum(len(x) for x, _ in data.values())} {args.format} images; IDX files in {idx}")


if __name__ == "__main__":
    main()
