"""Reproduces DALI 2.4's CPU image decoder crashes (SIGSEGV instead of an error) that easyfit's
host-side image checks (``easyfit/data/validation/structure.py``) exist to prevent.

Usage: ``python crash_without_checks.py <case> [--checked]``. Writes 100 MNIST digits of the
sample shipped with easyfit as an image folder, breaks one header field of one file, switches
easyfit's host-side check off (unless ``--checked``) and trains one epoch. On DALI 2.4.0 (CPU,
this machine) the process dies with SIGSEGV in ``Pipeline.run`` for the cases below in some
runs (about one in four for the JPEG case; in others DALI raises its own error or decodes
garbage); with the
check on, easyfit raises a DataError naming the file. (The same broken files decoded alone by a
plain DALI pipeline, ``fn.readers.file`` + ``fn.decoders.image``, raise a RuntimeError instead:
the crash needs the batch that easyfit's pipeline feeds, which is why this reproducer goes
through easyfit.)
"""

from __future__ import annotations

import io
import os
import sys
import tempfile

import numpy as np


def _encode(image: np.ndarray, fmt: str, **kw) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format=fmt, **kw)
    return buf.getvalue()


def _put(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new) :]


def _jpeg_segment(jpeg: bytes, marker: int) -> int:
    i = 2
    while jpeg[i + 1] != marker:
        i += 2 + int.from_bytes(jpeg[i + 2 : i + 4], "big")
    return i


def _rgb(image: np.ndarray) -> np.ndarray:
    return np.stack([image, np.roll(image, 3, 1), 255 - image], -1)


# case: (extension, encoder, corruption)
CASES = {
    "jpeg-segment-length-past-end": (
        "jpg",
        lambda a: _encode(a, "JPEG", quality=90),
        lambda b: _put(b, _jpeg_segment(b, 0xDB) + 2, b"\xf0\x00"),
    ),
    "bmp-bit-count-7": ("bmp", lambda a: _encode(a, "BMP"), lambda b: _put(b, 28, b"\x07\0")),
}
BROKEN = 34  # the file broken, in folder order


def main(case: str, checked: bool) -> None:
    from flax import linen as nn

    import easyfit as ef

    ext, encode, corrupt = CASES[case]
    x, y = ef.datasets.sample()["train"]
    root = tempfile.mkdtemp()
    for i, (image, label) in enumerate(zip(x[:100, :, :, 0], y[:100], strict=True)):
        os.makedirs(os.path.join(root, str(label)), exist_ok=True)
        with open(os.path.join(root, str(label), f"{i:03d}.{ext}"), "wb") as f:
            f.write(encode(image))
    source = ef.data.ImageFolder(root)
    path = source.files[BROKEN]
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(corrupt(data))
    if not checked:
        from easyfit.data.sources import folder

        folder.file_problem = lambda *args, **kwargs: None  # the host-side check, off
    model = nn.Sequential([lambda v: v.reshape((v.shape[0], -1)), nn.Dense(10)])
    try:
        ef.Trainer(model, seed=0).fit(source, epochs=1, batch_size=50, verbose=0)
    except ef.errors.DataError as e:
        print(f"DataError: {e}")
        return
    print("trained without an error")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in CASES:
        print("cases:", " ".join(CASES))
        sys.exit(2)
    main(sys.argv[1], "--checked" in sys.argv[2:])
