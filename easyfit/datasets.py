"""Datasets to try easyfit on: MNIST, and a small sample of it shipped inside the package, as
arrays or written out as an image folder."""

from __future__ import annotations

import gzip
import os
import shutil
import struct
import urllib.request
from collections.abc import Callable
from importlib import resources

import numpy as np

from ._env import user_cache_dir
from ._files import write_files
from ._synthetic import synthetic_images, write_png
from .errors import DataError

__all__ = ["mnist", "mnist_arrays", "sample", "sample_folder", "synthetic_images", "write_png"]

_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "val": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_MIRROR = "https://storage.googleapis.com/cvdf-datasets/mnist/"  # $EASYFIT_MNIST_MIRROR overrides
_MARKER = ".easyfit-mnist"
_SAMPLE = "mnist_sample.npz"


def _read_idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[:2] != b"\0\0" or data[2] != 8:
        raise DataError(f"{path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _cache_dir() -> str:
    return user_cache_dir("mnist")


def _locate(source: str | os.PathLike | None) -> str:
    source = source if source is not None else os.environ.get("EASYFIT_MNIST_DIR") or None
    if source is not None:
        source = os.fspath(source)
        missing = [f for pair in _FILES.values() for f in pair if not os.path.isfile(os.path.join(source, f))]
        if missing:
            raise DataError(f"{source}: MNIST files missing: {', '.join(missing)}")
        return source
    cache = _cache_dir()
    os.makedirs(cache, exist_ok=True)
    for name in (f for pair in _FILES.values() for f in pair):
        target = os.path.join(cache, name)
        if not os.path.isfile(target):
            tmp = target + ".part"
            url = os.environ.get("EASYFIT_MNIST_MIRROR", _MIRROR).rstrip("/") + "/" + name
            try:
                urllib.request.urlretrieve(url, tmp)
            except OSError as e:  # URLError, HTTPError, timeouts: all OSErrors
                raise DataError(
                    f"could not download MNIST from {url} ({e}). Without a network, use the "
                    "sample shipped with easyfit: ef.datasets.sample_folder(dir) (or "
                    "ef.datasets.sample() for arrays), or pass source= a folder holding "
                    "MNIST's four .gz files"
                ) from None
            os.replace(tmp, target)
    return cache


def mnist_arrays(source: str | os.PathLike | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """MNIST as arrays: ``{"train": (x, y), "val": (x, y)}``, x uint8 (n, 28, 28, 1).

    Args:
        source: a folder with the four gzipped IDX files; None uses ``$EASYFIT_MNIST_DIR`` if
            set, else downloads them once into ``~/.cache/easyfit/mnist``.

    Raises:
        DataError: ``source`` lacks a file, or the download failed (no network); the message
            names ``ef.datasets.sample_folder()`` and ``source=``.
    """
    root = _locate(source)
    out = {}
    for split, (images, labels) in _FILES.items():
        x = _read_idx(os.path.join(root, images))[..., None]
        out[split] = (x, _read_idx(os.path.join(root, labels)).astype(np.int32))
    return out


def mnist(
    out_dir: str | os.PathLike,
    *,
    source: str | os.PathLike | None = None,
    limit: tuple[int, int] | None = None,
) -> str:
    """Writes MNIST as an image folder: ``out_dir/{train,val}/<digit>/<n>.png``.

    Without ``source`` this downloads the full set (60,000 + 10,000 images) once; offline, use
    :func:`sample_folder`, the first 6,000 + 1,000 of them shipped inside easyfit.

    Args:
        out_dir: where to write; created if needed. A folder this function wrote before (with
            the same ``limit``) is reused as is; any other non-empty folder is refused, so
            nothing of yours is overwritten.
        source: a folder with MNIST's four gzipped IDX files; None uses
            ``$EASYFIT_MNIST_DIR`` if set, else downloads them once.
        limit: ``(train, val)`` numbers of images to write (the first ones of each split).

    Returns:
        ``out_dir``, ready for ``Trainer.fit(out_dir)``.

    Example:
        >>> import os, tempfile, easyfit as ef
        >>> root = ef.datasets.mnist(tempfile.mkdtemp(), limit=(100, 20))  # downloads once
        >>> sorted(os.listdir(root + "/train"))[:3], len(os.listdir(root + "/val/0")) > 0
        (['0', '1', '2'], True)
    """
    return _write_folder(out_dir, lambda: mnist_arrays(source), limit, f"limit={limit}")


def sample() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The MNIST sample inside easyfit: ``{"train": (x, y), "val": (x, y)}``, as ``mnist_arrays``.

    6,000 training and 1,000 validation images (the first of MNIST's training and test sets),
    x uint8 ``(n, 28, 28, 1)``, y int32. It ships with the package, so it needs no network
    (MNIST: Yann LeCun, Corinna Cortes, Christopher J.C. Burges; CC BY-SA 3.0, see
    ``easyfit/_sample/LICENSE-MNIST.txt``).

    Example:
        >>> import easyfit as ef
        >>> data = ef.datasets.sample()
        >>> x, y = data["train"]
        >>> x.shape, x.dtype, y.dtype, data["val"][0].shape
        ((6000, 28, 28, 1), dtype('uint8'), dtype('int32'), (1000, 28, 28, 1))
    """
    # one name per step: the joinpath of Python 3.10 takes a single name
    with (resources.files(__package__) / "_sample" / _SAMPLE).open("rb") as f, np.load(f) as npz:
        return {split: (npz[f"x_{split}"], npz[f"y_{split}"]) for split in _FILES}


def sample_folder(out_dir: str | os.PathLike, *, limit: tuple[int, int] | None = None) -> str:
    """Writes the packaged MNIST sample as an image folder: ``out_dir/{train,val}/<digit>/*.png``.

    Args:
        out_dir: where to write, as for ``mnist`` (a folder this function wrote before is
            reused; any other non-empty folder is refused).
        limit: ``(train, val)`` numbers of images to write (at most 6,000 and 1,000).

    Returns:
        ``out_dir``, ready for ``Trainer.fit(out_dir)``.

    Example:
        >>> import os, tempfile, easyfit as ef
        >>> tmp = tempfile.mkdtemp()
        >>> root = ef.datasets.sample_folder(tmp + "/sample", limit=(50, 10))
        >>> sorted(os.listdir(root + "/train")), len(os.listdir(root + "/val/9"))
        (['0', '1', '2', '3', '4', '5', '6', '7', '8', '9'], 2)
    """
    return _write_folder(out_dir, sample, limit, f"sample limit={limit}")


def _write_folder(
    out_dir: str | os.PathLike,
    load: Callable[[], dict[str, tuple[np.ndarray, np.ndarray]]],
    limit: tuple[int, int] | None,
    stamp: str,
) -> str:
    """Writes ``load()``'s splits as PNG class folders, unless ``out_dir`` holds them already."""
    out_dir = os.fspath(out_dir)
    marker = os.path.join(out_dir, _MARKER)
    if os.path.isfile(marker):
        with open(marker) as f:
            if f.read() == stamp:
                return out_dir
        for split in _FILES:  # written by an earlier call with another limit: ours to replace
            shutil.rmtree(os.path.join(out_dir, split), ignore_errors=True)
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not os.path.isfile(marker):
        raise ValueError(f"{out_dir}: exists and is not empty; choose a new folder for MNIST")
    data = load()
    for k, (split, (x, y)) in enumerate(data.items()):
        n = len(x) if limit is None else min(limit[k], len(x))
        for digit in np.unique(y[:n]):
            os.makedirs(os.path.join(out_dir, split, str(digit)), exist_ok=True)
        for i in range(n):
            write_png(os.path.join(out_dir, split, str(y[i]), f"{i:05d}.png"), x[i])
    write_files({marker: stamp.encode()})
    return out_dir
