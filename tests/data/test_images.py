"""Images that must never reach DALI's decoders are named first (issue 17): a header beyond the
pixel limit, a self-referencing symlink in an image folder."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np
import pytest

import easyfit as ef
from easyfit.data.validation import encoded
from tests.helpers.formats import encode


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def huge_png(side: int = 32000) -> bytes:
    """A valid grayscale PNG of side x side zero pixels (1 bit each), compressed row by row:
    ~130 KB on disk, never held whole in memory; IHDR says side x side."""
    z, row, parts = zlib.compressobj(9), b"\0" * (1 + side // 8), []
    for _ in range(side):
        parts.append(z.compress(row))
    parts.append(z.flush())
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", b"".join(parts))
        + _png_chunk(b"IEND", b"")
    )


@pytest.fixture
def folder(tmp_path, mnist_arrays):
    x, y = mnist_arrays["train"]
    for i in range(12):
        os.makedirs(tmp_path / str(y[i]), exist_ok=True)
        (tmp_path / str(y[i]) / f"{i:03d}.png").write_bytes(encode(x[i]))
    return tmp_path, y[:12]


def test_an_image_beyond_the_pixel_limit_is_named_before_dali_decodes_it(folder, trainer):
    root, y = folder
    big = root / str(y[5]) / "005-big.png"
    big.write_bytes(huge_png())
    with pytest.raises(
        ef.errors.DataError, match=f"^{big}: PNG of 32000x32000 pixels, more than MAX_IMAGE_PIXELS"
    ):
        trainer.fit(ef.data.ImageFolder(root, image_size=(28, 28)), epochs=1, batch_size=13, verbose=0)


def test_the_pixel_limit_can_be_changed(monkeypatch):
    png = encode(np.zeros((28, 28), np.uint8))
    assert encoded.image_problem(png) is None
    monkeypatch.setattr(encoded, "MAX_IMAGE_PIXELS", 28 * 28 - 1)
    assert "PNG of 28x28 pixels, more than MAX_IMAGE_PIXELS (783" in encoded.image_problem(png)
    monkeypatch.setattr(encoded, "MAX_IMAGE_PIXELS", None)
    assert encoded.image_problem(huge_png(4096)) is None


@pytest.mark.parametrize("fmt,kind", [("jpeg", "JPEG"), ("bmp", "BMP"), ("webp", "WebP")])
def test_every_image_header_is_held_to_the_limit(monkeypatch, fmt, kind):
    monkeypatch.setattr(encoded, "MAX_IMAGE_PIXELS", 30 * 40 - 1)
    problem = encoded.image_problem(encode(np.zeros((30, 40, 3), np.uint8), fmt))
    assert problem.startswith(f"{kind} of 40x30 pixels, more than MAX_IMAGE_PIXELS"), problem


@pytest.mark.parametrize("where", ["in a class folder", "as a class folder"])
def test_a_self_referencing_symlink_is_named(folder, trainer, where):
    root, y = folder
    loop = root / str(y[0]) / "loop.png" if where == "in a class folder" else root / "loop"
    os.symlink(loop.name, loop)
    with pytest.raises(
        ef.errors.DataError, match=f"^{loop}: cannot be followed .Too many levels of symbolic links"
    ):
        trainer.fit(str(root), epochs=1, batch_size=12, verbose=0)


def _pillow(mode: str, fmt: str) -> bytes:
    import io

    from PIL import Image

    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (12, 16, 3), np.uint8)).convert(mode)
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize(
    "mode, fmt",
    [("L", "JPEG"), ("RGB", "JPEG"), ("CMYK", "JPEG"), ("L", "PNG"), ("LA", "PNG"), ("RGB", "PNG")]
    + [("RGBA", "PNG"), ("P", "PNG"), ("I;16", "PNG")],
)
def test_the_channels_read_from_headers_are_those_dalis_peek_reports(mode, fmt):
    from easyfit.data.images import peek_shapes, stored_channels

    sample = [(f"a.{fmt.lower()}", _pillow(mode, fmt))]
    assert stored_channels(sample) == [peek_shapes(sample)[0][2]]


def test_a_header_that_does_not_tell_the_channels_leaves_them_to_dali():
    from easyfit.data.images import stored_channels

    bmp = _pillow("RGB", "BMP")
    assert stored_channels([("a.png", _pillow("L", "PNG")), ("b.bmp", bmp)]) is None


def test_a_grayscale_jpeg_folder_with_an_image_size_is_inferred_grayscale_and_a_mixed_one_rgb(tmp_path):
    for name, mode in [("g0", "L"), ("g1", "L"), ("c0", "RGB")]:
        (tmp_path / "gray" / "a").mkdir(parents=True, exist_ok=True)
        (tmp_path / "mixed" / "a").mkdir(parents=True, exist_ok=True)
        data = _pillow(mode, "JPEG")
        if mode == "L":
            (tmp_path / "gray" / "a" / f"{name}.jpg").write_bytes(data)
        (tmp_path / "mixed" / "a" / f"{name}.jpg").write_bytes(data)
    gray = ef.data.ImageFolder(str(tmp_path / "gray"), image_size=(8, 8))
    mixed = ef.data.ImageFolder(str(tmp_path / "mixed"), image_size=(8, 8))
    assert (gray.color_mode, gray.image_shape) == ("grayscale", (8, 8, 1))
    assert (mixed.color_mode, mixed.image_shape) == ("rgb", (8, 8, 3))


def test_a_file_that_is_not_an_image_is_named_when_the_channels_come_from_headers(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "good.jpg").write_bytes(_pillow("RGB", "JPEG"))
    (tmp_path / "a" / "notes.jpg").write_bytes(b"not an image at all")
    with pytest.raises(ef.errors.DataError, match="notes.jpg"):
        ef.data.ImageFolder(str(tmp_path), image_size=(8, 8))
