"""An ImageNet-shaped folder of generated images: photos of many sizes, classes a model can learn.

Used by the ImageNet example's ``--smoke`` run, the tests of the crop-and-normalise recipe and
``benchmarks/imagenet.py`` (which writes tens of thousands of them on the GPU machine).
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from ._files import write_files

__all__ = ["synthetic_images", "write_png"]


def write_png(path: str | os.PathLike, image: np.ndarray) -> None:
    """Writes an 8-bit grayscale (HxW or HxWx1), RGB or RGBA image as PNG.

    The format is small enough to write with the standard library (zlib), which spares easyfit
    an imaging dependency. The file is written whole to a staging name, then renamed: a failed
    write leaves the file there before as it was.
    """
    image = np.ascontiguousarray(image, np.uint8)
    h, w = image.shape[:2]
    channels = 1 if image.ndim == 2 else image.shape[2]
    color_type = {1: 0, 3: 2, 4: 6}[channels]
    rows = image.reshape(h, w * channels)
    raw = np.concatenate([np.zeros((h, 1), np.uint8), rows], axis=1).tobytes()

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6))
    # whole or not at all (a staging name, renamed); one of many files: not synced one by one
    write_files({os.fspath(path): data + chunk(b"IEND", b"")}, sync=False)


def _image(
    cls: int, classes: int, rng: np.random.Generator, size: tuple[int, int], noise: float
) -> np.ndarray:
    """An RGB uint8 image of class ``cls``: its hue and its stripes' angle say the class;
    smooth texture and pixel noise make the rest (and the JPEG's size) photo-like."""
    lo, hi = size
    h, w = (int(v) for v in rng.integers(lo, hi + 1, size=2))
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    angle = np.pi * cls / classes
    phase = rng.uniform(0, 2 * np.pi)
    stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) / 9.0 + phase)
    hue = 2 * np.pi * cls / classes
    base = 128 + 70 * np.array([np.cos(hue), np.cos(hue + 2.1), np.cos(hue + 4.2)], np.float32)
    coarse = rng.normal(0, 30, size=(h // 32 + 2, w // 32 + 2, 3)).astype(np.float32)
    texture = np.repeat(np.repeat(coarse, 32, axis=0), 32, axis=1)[:h, :w]
    image = base + 40 * stripes[..., None] + texture + rng.normal(0, noise, (h, w, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def _write(job: tuple[str, int, int, int, tuple[int, int], str, int, float]) -> None:
    path, cls, classes, seed, size, fmt, quality, noise = job
    image = _image(cls, classes, np.random.default_rng(seed), size, noise)
    if fmt == "png":
        write_png(path, image)
        return
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    write_files({path: buffer.getvalue()}, sync=False)


def synthetic_images(
    out_dir: str | os.PathLike,
    *,
    classes: int = 10,
    per_class: tuple[int, int] = (20, 5),
    size: tuple[int, int] = (300, 550),
    image_format: str = "jpeg",
    quality: int = 90,
    noise: float = 20.0,
    seed: int = 0,
    workers: int | None = None,
) -> str:
    """Writes ``out_dir/{train,val}/<class>/<n>.<ext>``: generated photos laid out like ImageNet.

    Each image has a random height and width in ``size``; its class shows in its hue and in the
    angle of its stripes, so a model learns it in a few epochs. At the defaults a JPEG weighs
    about 90 KiB, like an ImageNet photo. The same arguments write the same files.

    Args:
        out_dir: where to write (created; files already there are overwritten only if they have
            these names).
        classes: number of classes (folders ``class_000``, ...).
        per_class: ``(train, val)`` images per class.
        size: the smallest and largest side, in pixels.
        image_format: ``"jpeg"`` (needs Pillow: ``pip install pillow``) or ``"png"`` (written
            with the standard library).
        quality: JPEG quality.
        noise: standard deviation of the pixel noise (more noise, larger files).
        seed: the seed of everything drawn.
        workers: processes that write (default: one per core, at most 32).

    Returns:
        ``out_dir``.

    Example:
        >>> import os, tempfile, easyfit as ef
        >>> tmp = tempfile.mkdtemp()
        >>> root = ef.datasets.synthetic_images(tmp + "/photos", classes=3,
        ...                                     per_class=(2, 1), image_format="png")
        >>> sorted(os.listdir(root + "/train")), len(os.listdir(root + "/val/class_002"))
        (['class_000', 'class_001', 'class_002'], 1)
    """
    if image_format not in ("jpeg", "png"):
        raise ValueError(f"image_format={image_format!r}: expected 'jpeg' or 'png'")
    if image_format == "jpeg":
        try:
            import PIL  # noqa: F401
        except ImportError:
            raise ImportError(
                "synthetic_images(image_format='jpeg') needs Pillow "
                "(pip install pillow); image_format='png' does not"
            ) from None
    ext = "jpg" if image_format == "jpeg" else "png"
    jobs: list[Any] = []
    for s, (split, n) in enumerate(zip(("train", "val"), per_class, strict=True)):
        for c in range(classes):
            folder = os.path.join(os.fspath(out_dir), split, f"class_{c:03d}")
            os.makedirs(folder, exist_ok=True)
            for i in range(n):
                job_seed = int(np.random.SeedSequence([seed, s, c, i]).generate_state(1)[0])
                jobs.append(
                    (
                        os.path.join(folder, f"{i:05d}.{ext}"),
                        c,
                        classes,
                        job_seed,
                        tuple(size),
                        image_format,
                        quality,
                        noise,
                    )
                )
    workers = workers or min(32, os.cpu_count() or 1)
    if workers == 1 or len(jobs) < 64:
        for job in jobs:
            _write(job)
    else:
        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_write, jobs, chunksize=32))
    return os.fspath(out_dir)
