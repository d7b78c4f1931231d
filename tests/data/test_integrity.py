"""Images broken inside (header and end marker in place) raise DataError naming the file before
DALI decodes them: DALI 2.4's CPU decoders crash the process on some such images and decode
others silently to wrong pixels (docs/data-formats.md). Valid but unusual files still pass."""

from __future__ import annotations

import io
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import easyfit as ef
from easyfit.data.images import sample_positions
from easyfit.data.validation.encoded import encoded_problem, header_size
from easyfit.data.validation.files import file_problem
from easyfit.data.validation.jpeg import _HEADERS, _first_scan, jpeg_problem

N = 100
LATE = next(i for i in range(N) if i not in set(sample_positions(N)))  # not read up front


@pytest.fixture(scope="module")
def digits(mnist_arrays):
    x, y = mnist_arrays["train"]
    return x[:N, :, :, 0], y[:N]


def _save(image: np.ndarray, fmt: str, **kw) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format=fmt, **kw)
    return buf.getvalue()


def _rgb(image: np.ndarray) -> np.ndarray:
    return np.stack([image, np.roll(image, 3, 1), 255 - image], -1)


def _put(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new) :]


def _segment(jpeg: bytes, marker: int) -> int:
    """The offset of the first JPEG marker segment ``FF marker`` before the scan."""
    i = 2
    while jpeg[i + 1] != marker:
        i += 2 + int.from_bytes(jpeg[i + 2 : i + 4], "big")
    return i


def _mid_scan(jpeg: bytes) -> int:
    sos = _segment(jpeg, 0xDA)
    start = sos + 2 + int.from_bytes(jpeg[sos + 2 : sos + 4], "big")
    return (start + jpeg.rindex(b"\xff\xd9")) // 2


def _chunk(png: bytes, kind: bytes) -> int:
    """The offset of PNG chunk ``kind`` (its length field)."""
    return png.index(kind) - 4


def _fix_crcs(png: bytes) -> bytes:
    """``png`` with every chunk's CRC made right again (the corruption is then only inside)."""
    out, i = bytearray(png), 8
    while i < len(out):
        length = int.from_bytes(out[i : i + 4], "big")
        out[i + 8 + length : i + 12 + length] = struct.pack(">I", zlib.crc32(out[i + 4 : i + 8 + length]))
        i += 12 + length
    return bytes(out)


def _png(
    raw_rows: bytes,
    width: int,
    height: int,
    depth: int = 8,
    color: int = 0,
    interlace: int = 0,
    palette: bytes = b"",
) -> bytes:
    """A PNG of already filtered rows (each with its filter byte), written by hand."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, interlace)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + (chunk(b"PLTE", palette) if palette else b"")
        + chunk(b"IDAT", zlib.compress(raw_rows))
        + chunk(b"IEND", b"")
    )


def _adam7(image: np.ndarray, depth: int = 8, color: int = 0) -> bytes:
    """An interlaced (Adam7) PNG of uint8/uint16 ``image`` (HxW or HxWxC)."""
    raw = b""
    for x0, y0, dx, dy in [
        (0, 0, 8, 8),
        (4, 0, 8, 8),
        (0, 4, 4, 8),
        (2, 0, 4, 4),
        (0, 2, 2, 4),
        (1, 0, 2, 2),
        (0, 1, 1, 2),
    ]:
        part = image[y0::dy, x0::dx]
        if part.size:
            rows = part.astype(">u2" if depth == 16 else np.uint8).reshape(part.shape[0], -1)
            raw += b"".join(b"\0" + row.tobytes() for row in rows)
    return _png(raw, image.shape[1], image.shape[0], depth, color, interlace=1)


def _png_rows(png: bytes, change) -> bytes:
    """``png`` with its inflated rows changed by ``change`` and deflated again (CRCs right)."""
    at = _chunk(png, b"IDAT")
    length = int.from_bytes(png[at : at + 4], "big")
    data = zlib.compress(change(zlib.decompress(png[at + 8 : at + 8 + length])))
    return _fix_crcs(
        png[:at] + struct.pack(">I", len(data)) + b"IDAT" + data + b"0000" + png[at + 12 + length :]
    )


def _rle8_bmp(image: np.ndarray) -> bytes:
    """An 8-bit grayscale BMP compressed with RLE8 (runs of one pixel), written by hand."""
    rle = b"".join(b"".join(bytes([1, v]) for v in row) + b"\0\0" for row in image[::-1])
    rle += b"\0\1"
    palette = b"".join(bytes([v, v, v, 0]) for v in range(256))
    offset = 14 + 40 + len(palette)
    info = struct.pack(
        "<IiiHHIIiiII", 40, image.shape[1], image.shape[0], 1, 8, 1, len(rle), 2835, 2835, 256, 0
    )
    return b"BM" + struct.pack("<IHHI", offset + len(rle), 0, 0, offset) + info + palette + rle


_JPEG = ("jpg", lambda a: _save(a, "JPEG", quality=90))
_PNG = ("png", lambda a: _save(a, "PNG"))
_BMP = ("bmp", lambda a: _save(a, "BMP"))
_WEBP = ("webp", lambda a: _save(_rgb(a), "WEBP", quality=80))
_WEBP_LOSSLESS = ("webp", lambda a: _save(_rgb(a), "WEBP", lossless=True))

# name: (extension and encoder, corruption, message). Comments: what DALI 2.4 does with it.
CORRUPTIONS = {
    "jpeg segment length past its end": (  # crashes (SIGSEGV)
        _JPEG,
        lambda b: _put(b, _segment(b, 0xDB) + 2, b"\xf0\x00"),
        "JPEG segment FFDB at byte 20 has length 61440, past the end",
    ),
    "jpeg frame header gone": (  # crashes
        _JPEG,
        lambda b: _put(b, _segment(b, 0xC0) + 1, b"\xe5"),
        "scan before the frame header",
    ),
    "jpeg quantization table of zeros": (  # decodes silently to wrong pixels
        _JPEG,
        lambda b: _put(b, _segment(b, 0xDB) + 5, bytes(64)),
        "quantization table 0 holds a zero",
    ),
    "jpeg Huffman table counts": (  # raises
        _JPEG,
        lambda b: _put(b, _segment(b, 0xC4) + 5, b"\xff" * 16),
        "Huffman table segment",
    ),
    "jpeg stray marker in the scan": (  # decodes silently to wrong pixels
        _JPEG,
        lambda b: _put(b, _mid_scan(b), b"\xff\x01"),
        "JPEG data where a marker should be",
    ),
    "jpeg frame header in the scan": (  # decodes silently to wrong pixels
        _JPEG,
        lambda b: _put(b, _mid_scan(b), b"\xff\xc0"),
        "JPEG segment FFC0 .* past the end",
    ),
    "jpeg restart marker without interval": (  # decodes silently to wrong pixels
        _JPEG,
        lambda b: _put(b, _mid_scan(b), b"\xff\xd3"),
        "restart marker FFD3 at byte \\d+ without",
    ),
    "png bit depth 3": (  # crashes
        _PNG,
        lambda b: _fix_crcs(_put(b, _chunk(b, b"IHDR") + 16, b"\x03")),
        "PNG IHDR invalid",
    ),
    "png chunk length past the end": (  # crashes
        _PNG,
        lambda b: _put(b, _chunk(b, b"IDAT"), b"\0\0\x7f\0"),
        "PNG chunk b'IDAT' .* runs past",
    ),
    "png IDAT bytes changed": (  # raises
        _PNG,
        lambda b: _put(b, _chunk(b, b"IDAT") + 30, b"\x5a" * 8),
        "PNG chunk IDAT .* fails its CRC",
    ),
    "png IDAT bytes changed, CRC made right": (  # raises, or decodes silently to wrong pixels
        _PNG,
        lambda b: _fix_crcs(_put(b, _chunk(b, b"IDAT") + 40, bytes(16))),
        "PNG image data do not inflate",
    ),
    "png rows missing, CRC made right": (  # raises
        _PNG,
        lambda b: _png_rows(b, lambda raw: raw[: len(raw) // 2]),
        "PNG image data inflate to",
    ),
    "png unknown row filter": (  # raises
        _PNG,
        lambda b: _png_rows(b, lambda raw: b"\x07" + raw[1:]),
        "PNG row with an unknown filter",
    ),
    "bmp bit count 7": (  # crashes
        _BMP,
        lambda b: _put(b, 28, b"\x07\0"),
        "BMP header invalid .* 7 bits per pixel",
    ),
    "bmp unknown compression": (  # crashes
        _BMP,
        lambda b: _put(b, 30, b"\x09\0\0\0"),
        "BMP header invalid .* compression 9",
    ),
    "bmp info header size": (  # decodes silently to wrong pixels
        _BMP,
        lambda b: _put(b, 14, b"\xc8\0\0\0"),
        "BMP info header of 200 bytes",
    ),
    "bmp RLE8 flag on raw pixels": (  # decodes silently to wrong pixels
        _BMP,
        lambda b: _put(b, 30, b"\x01\0\0\0"),
        "BMP RLE data",
    ),
    "webp VP8 start code": (  # crashes
        _WEBP,
        lambda b: _put(b, 23, b"\0\0\0"),
        "VP8 frame that is not a key frame",
    ),
    "webp VP8L signature": (  # crashes
        _WEBP_LOSSLESS,
        lambda b: _put(b, 20, b"\0"),
        "VP8L frame without its signature",
    ),
}


def _folder(root, digits, ext: str, encode) -> list[str]:
    """``root/<digit>/<n>.<ext>`` of the N digits; the paths in ImageFolder order."""
    for i, (image, label) in enumerate(zip(*digits, strict=True)):
        os.makedirs(os.path.join(root, str(label)), exist_ok=True)
        with open(os.path.join(root, str(label), f"{i:03d}.{ext}"), "wb") as f:
            f.write(encode(image))
    return ef.data.ImageFolder(root).files


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_an_image_broken_inside_is_named_before_dali_decodes_it(tmp_path, digits, trainer, kind):
    (ext, encode), corrupt, message = CORRUPTIONS[kind]
    files = _folder(tmp_path, digits, ext, encode)
    with open(files[LATE], "rb") as f:
        good = f.read()
    bad = corrupt(good)
    assert bad != good and (bad[:4], bad[-2:]) == (good[:4], good[-2:])  # signature, end intact
    with open(files[LATE], "wb") as f:
        f.write(bad)
    with pytest.raises(ef.errors.DataError, match=f"^{files[LATE]}: {message}"):
        trainer.fit(ef.data.ImageFolder(tmp_path, color_mode="grayscale"), epochs=1, batch_size=N, verbose=0)


@pytest.mark.parametrize("kind", [k for k in CORRUPTIONS if CORRUPTIONS[k][0] is _JPEG])
def test_a_jpeg_is_checked_whole_after_one_of_the_same_header(digits, kind):
    # the walk of a header to its first scan is remembered by its bytes: a file of the same
    # header starts at its scan, and what is broken there or in its header is still found
    (_, encode), corrupt, message = CORRUPTIONS[kind]
    good = encode(digits[0][0])
    assert jpeg_problem(good) is None and _first_scan(good) in _HEADERS
    problem = jpeg_problem(corrupt(good))
    assert problem is not None and re.match(message, problem), problem


def test_a_scan_marker_inside_an_earlier_segment_does_not_stand_for_the_header(digits):
    # FF DA in a comment before the real scan: the bytes up to it are no header to remember,
    # so a file sharing them but with a table of zeros after the comment is still walked whole
    good = _save(digits[0][0], "JPEG", quality=90, comment=b"\xff\xda\x00\x08abcdef")
    assert good.find(b"\xff\xda") < _segment(good, 0xDB) < _segment(good, 0xDA)
    assert jpeg_problem(good) is None and _first_scan(good) not in _HEADERS
    problem = jpeg_problem(_put(good, _segment(good, 0xDB) + 5, bytes(64)))
    assert problem is not None and problem.startswith("quantization table 0 holds a zero"), problem


def test_a_progressive_jpeg_of_a_kept_header_is_walked_past_its_first_scan(digits):
    # a baseline file of a kept header ends at its first scan; a progressive one goes on, and
    # what is broken in a segment between its later scans is still found
    good = _unusual(digits[0][0])["progressive.jpg"]
    assert jpeg_problem(good) is None and jpeg_problem(good) is None  # the second from its header
    first = _segment(good, 0xDA)
    later = good.index(b"\xff\xc4", first + 2 + int.from_bytes(good[first + 2 : first + 4], "big"))
    problem = jpeg_problem(_put(good, later + 2, b"\xff\xf0"))  # that table's length: past the end
    assert problem is not None, "the broken table after the first scan was not found"
    assert problem.startswith(f"JPEG segment FFC4 at byte {later} has length"), problem


def test_a_jpeg_header_size_is_its_own_after_the_walk_of_another(digits):
    # header_size takes a JPEG's size from the header walked last only for a file that starts
    # with that header
    square, wide = _save(digits[0][0], "JPEG"), _save(np.tile(digits[0][0], (1, 2)), "JPEG")
    for data in (square, wide, square):
        assert jpeg_problem(data) is None
        assert (header_size("JPEG", square), header_size("JPEG", wide)) == ((28, 28), (56, 28))


def _unusual(image: np.ndarray) -> dict[str, bytes]:
    """Valid files of the kinds a structural check could mistake for broken ones."""
    from PIL import Image

    big = np.kron(image, np.ones((8, 8), np.uint8))  # 224x224: several restart intervals
    noisy = np.clip(
        _rgb(big).astype(int) + np.random.default_rng(0).integers(-30, 30, (224, 224, 3)), 0, 255
    ).astype(np.uint8)
    exif = Image.Exif()
    exif[0x010F] = "easyfit"
    return {
        "progressive.jpg": _save(noisy, "JPEG", progressive=True),
        "restart_blocks.jpg": _save(noisy, "JPEG", restart_marker_blocks=3),
        "restart_rows_gray.jpg": _save(big, "JPEG", restart_marker_rows=1),
        "restart_progressive.jpg": _save(noisy, "JPEG", progressive=True, restart_marker_blocks=2),
        "exif_icc_comment.jpg": _save(
            _rgb(image), "JPEG", exif=exif, icc_profile=bytes(3000), comment=b"a comment"
        ),
        "subsampling_444.jpg": _save(_rgb(image), "JPEG", subsampling=0, quality=100),
        "interlaced.png": _adam7(image),
        "interlaced_rgb16.png": _adam7(_rgb(image).astype(np.uint16) * 257, depth=16, color=2),
        "gray16.png": _save(image.astype(np.uint16) * 257, "PNG"),
        "palette.png": _save_palette(_rgb(image)),
        "one_bit.png": _save(image > 127, "PNG"),
        "rgba.png": _save(np.dstack([_rgb(image), image]), "PNG"),
        "rle8.bmp": _rle8_bmp(image),
        "palette.bmp": _save_palette(_rgb(image), "BMP"),
        "lossless.webp": _save(_rgb(image), "WEBP", lossless=True),
        "alpha.webp": _save(np.dstack([_rgb(image), image]), "WEBP"),
    }


def _save_palette(image: np.ndarray, fmt: str = "PNG") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).convert("P").save(buf, format=fmt)
    return buf.getvalue()


def test_valid_unusual_images_pass(tmp_path, digits, trainer):
    files = _unusual(digits[0][0])
    for k, (name, data) in enumerate(files.items()):
        path = tmp_path / str(k % 2) / name
        os.makedirs(path.parent, exist_ok=True)
        path.write_bytes(data)
        assert file_problem(str(path), encoded_problem) is None, name
    assert b"\xff\xd3" in files["restart_blocks.jpg"] and b"\xff\xd3" in files["restart_rows_gray.jpg"]
    # and DALI decodes them all in one batch
    history = trainer.fit(
        ef.data.ImageFolder(tmp_path, image_size=(28, 28), color_mode="grayscale"),
        epochs=1,
        batch_size=len(files),
        verbose=0,
    )
    assert np.isfinite(history.history["loss"]).all()


def test_a_record_broken_inside_is_named(tmp_path, digits):
    from easyfit.data import Loader
    from tests.helpers.formats import write_webdataset

    pngs = [_save(a, "PNG") for a in digits[0][:20]]
    pngs[LATE % 20] = CORRUPTIONS["png IDAT bytes changed, CRC made right"][1](pngs[LATE % 20])
    tar = write_webdataset(tmp_path / "w.tar", pngs, digits[1][:20])
    source = ef.data.WebDataset(tar, color_mode="grayscale", image_size=(28, 28))
    loader = Loader(source, ef.data.Plan(20, 20, shuffle=False), ef.parallel.Placement.create())
    try:
        with pytest.raises(
            ef.errors.DataError, match=f"^{tar}: {LATE % 20:06d}: PNG image data do not inflate"
        ):
            next(loader)
    finally:
        loader.close()


# The crashes easyfit's host-side image checks prevent (tests/dali_repro): the same broken files,
# checked, give a DataError naming the file.

SCRIPT = Path(__file__).resolve().parents[1] / "dali_repro" / "crash_without_checks.py"
CASES = ["jpeg-segment-length-past-end", "bmp-bit-count-7"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "XLA_FLAGS": ""},
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_the_check_names_the_file_that_crashes_dali(case):
    """The reproducer's broken files, checked: a DataError naming the file. (Without the check,
    ``python tests/dali_repro/crash_without_checks.py <case>``, DALI 2.4 dies with SIGSEGV in
    some runs, about one in four for the JPEG case on a 2-core machine, and in the others
    raises its own decoding error or decodes garbage: not something a test can wait for.)"""
    checked = _run(case, "--checked")
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert checked.stdout.strip().startswith("DataError: /")  # names the file
