"""Structural checks of whole encoded images (JPEG, PNG, BMP, WebP), on the host, in Python
with the standard library: what each check reads, and what it cannot see.

* JPEG (:mod:`easyfit.data.validation.jpeg`): every marker segment's length and contents
  (SOF, DHT, DQT, SOS, DRI), their order, the markers inside entropy-coded data (only stuffed
  ``FF 00``, fill bytes and restart markers, in sequence and as many as the restart interval
  implies) up to the end-of-image marker. The entropy-coded data itself is not decoded: a
  changed bit there decodes, in any decoder, to wrong pixels without an error.
* PNG: every chunk's length and CRC, the IHDR fields, the zlib stream of the IDAT chunks
  (it inflates, its Adler-32 matches, to at least the size IHDR implies) and each row's
  filter type.
* BMP: the header (size, dimensions, bit count, compression, pixel data inside the file) and
  an RLE stream's structure. Uncompressed pixel bytes cannot be wrong.
* WebP: the RIFF chunks' sizes and the VP8/VP8L frame headers. The compressed frame itself is
  not decoded (a changed byte in a lossy frame decodes to wrong pixels).
"""

from __future__ import annotations

import struct
import zlib

from ._bytes import ceil_div as _ceil
from ._bytes import u16 as _u16
from ._bytes import u32 as _u32
from .jpeg import jpeg_problem

__all__ = ["bmp_problem", "jpeg_problem", "png_problem", "structure_problem", "webp_problem"]


def structure_problem(kind: str, data: bytes, size: int | None = None) -> str | None:
    """What is broken in encoded image ``data`` of ``kind`` (``"JPEG"``, ``"PNG"``, ``"BMP"``,
    ``"WebP"``; other kinds are not checked); None when its structure is sound.

    ``size``: the size of the whole image when ``data`` holds only its first bytes; then
    only the headers found in them are checked (BMP, WebP).
    """
    size = len(data) if size is None else size
    if kind == "BMP":
        return bmp_problem(data, size)
    if kind == "WebP":
        return webp_problem(data, size)
    if len(data) < size:
        return None
    if kind == "JPEG":
        return jpeg_problem(data)
    if kind == "PNG":
        return png_problem(data)
    return None


# ---------------------------------------------------------------------------------------- PNG
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_PIECE = 1 << 20  # bytes inflated at a time
_DEFLATE_RATIO = 1032  # deflate's largest expansion
_CHUNK = struct.Struct(">I4s")  # a chunk's length and type
_CRC = struct.Struct(">I")
_IHDR = struct.Struct(">IIBB")  # width, height, bit depth, color type


def png_problem(data: bytes) -> str | None:
    """What is broken in PNG ``data`` (chunk lengths and CRCs, IHDR, the IDAT zlib stream and
    its size, row filter types); None when it is sound."""
    view, n, i = memoryview(data), len(data), 8
    header, idat, ended = None, [], False
    while i + 12 <= n and not ended:
        length, kind = _CHUNK.unpack_from(data, i)
        if i + 12 + length > n:
            return f"PNG chunk {kind!r} at byte {i} runs past the end of the file"
        if not kind.isalpha():
            return f"not a PNG chunk at byte {i} ({kind!r})"
        if zlib.crc32(view[i + 4 : i + 8 + length]) != _CRC.unpack_from(data, i + 8 + length)[0]:
            return f"PNG chunk {kind.decode()} at byte {i} fails its CRC check"
        if header is None and kind != b"IHDR":
            return "PNG without an IHDR chunk first"
        if kind == b"IHDR":
            header = data[i + 8 : i + 8 + length]
            problem = _ihdr_problem(header)
            if problem:
                return problem
        elif kind == b"IDAT":
            idat.append(view[i + 8 : i + 8 + length])
        ended = kind == b"IEND"
        i += 12 + length
    if not ended:
        return "PNG chunks do not end with an IEND chunk"
    if not idat:
        return "PNG without image data (no IDAT chunk)"
    assert header is not None  # the first chunk was checked to be an IHDR
    return _idat_problem(header, idat)


def _ihdr_problem(header: bytes) -> str | None:
    if len(header) != 13:
        return "PNG IHDR chunk of a wrong length"
    width, height, depth, color = _IHDR.unpack_from(header)
    if (
        not (0 < width < 1 << 31 and 0 < height < 1 << 31)
        or depth not in _PNG_DEPTHS.get(color, ())
        or header[10]
        or header[11]
        or header[12] > 1
    ):
        return (
            f"PNG IHDR invalid ({width}x{height}, bit depth {depth}, color type {color}, "
            f"methods {header[10]}/{header[11]}/{header[12]})"
        )
    return None


def _passes(header: bytes) -> list[tuple[int, int]]:
    """``(rows, bytes per row with its filter byte)`` of each non-empty (interlace) pass."""
    width, height, depth, color = _IHDR.unpack_from(header)
    bits = depth * _PNG_CHANNELS[color]
    grid = (
        [(0, 0, 1, 1)]
        if not header[12]
        else [
            (0, 0, 8, 8),
            (4, 0, 8, 8),
            (0, 4, 4, 8),
            (2, 0, 4, 4),
            (0, 2, 2, 4),
            (1, 0, 2, 2),
            (0, 1, 1, 2),
        ]
    )
    out = []
    for x0, y0, dx, dy in grid:
        w, h = _ceil(width - x0, dx), _ceil(height - y0, dy)
        if w > 0 and h > 0:
            out.append((h, 1 + _ceil(w * bits, 8)))
    return out


def _idat_problem(header: bytes, idat: list[memoryview]) -> str | None:
    passes = _passes(header)
    expected = sum(h * row for h, row in passes)
    compressed = sum(len(part) for part in idat)
    if expected > compressed * _DEFLATE_RATIO + 64:
        return (
            f"PNG IHDR says {_u32(header, 0)}x{_u32(header, 4)}, more than its "
            f"{compressed} bytes of IDAT data can hold"
        )
    stride = passes[0][1] if len(passes) == 1 else 0  # filter bytes checked without interlace
    inflate, got = zlib.decompressobj(), 0
    try:
        for part in idat:
            pending = bytes(part)
            while pending and got <= expected and not inflate.eof:
                out = inflate.decompress(pending, _PIECE)
                pending = inflate.unconsumed_tail
                if stride and max(out[(-got) % stride : expected - got : stride], default=0) > 4:
                    return "PNG row with an unknown filter type"
                got += len(out)
    except zlib.error as e:
        return f"PNG image data do not inflate ({e})"
    if got < expected:
        return f"PNG image data inflate to {got} bytes, IHDR implies {expected}"
    return None


# ---------------------------------------------------------------------------------------- BMP
_BMP_HEADERS = (12, 16, 40, 52, 56, 64, 108, 124)
_BMP_BITS = (1, 4, 8, 16, 24, 32)
_BMP_COMPRESSIONS = (0, 1, 2, 3, 4, 5, 6, 11, 12, 13)


def bmp_problem(data: bytes, size: int | None = None) -> str | None:
    """What is broken in BMP ``data`` (its header; an RLE stream when ``data`` is whole);
    None when sound. ``size``: the file's size when ``data`` holds only its first bytes."""
    size = len(data) if size is None else size
    if len(data) < 26:
        return "truncated BMP header"
    offset, info = _u32(data, 10, "little"), _u32(data, 14, "little")
    if info not in _BMP_HEADERS:
        return f"BMP info header of {info} bytes (no BMP header has that size)"
    if info == 12:
        width, height = _u16(data, 18, "little"), _u16(data, 20, "little")
        planes, bits, compression, colors = _u16(data, 22, "little"), _u16(data, 24, "little"), 0, 0
    else:
        if len(data) < 50:
            return "truncated BMP header"
        width = int.from_bytes(data[18:22], "little", signed=True)
        height = int.from_bytes(data[22:26], "little", signed=True)
        planes, bits = _u16(data, 26, "little"), _u16(data, 28, "little")
        compression = _u32(data, 30, "little") if info >= 20 else 0
        colors = _u32(data, 46, "little") if info >= 40 else 0
    if (
        width <= 0
        or height == 0
        or planes != 1
        or bits not in _BMP_BITS
        or compression not in _BMP_COMPRESSIONS
        or (compression == 1 and bits != 8)
        or (compression == 2 and bits != 4)
        or (bits <= 8 and colors > 1 << bits)
    ):
        return (
            f"BMP header invalid ({width}x{height}, {planes} planes, {bits} bits per pixel, "
            f"compression {compression}, {colors} colors)"
        )
    if not 14 + info <= offset <= size:
        return f"BMP pixel data offset {offset} outside the file ({size} bytes)"
    if compression in (0, 3, 6) and offset + (width * bits + 31) // 32 * 4 * abs(height) > size:
        return f"truncated BMP pixel data ({width}x{abs(height)} at {bits} bits need more)"
    if len(data) == size and compression in (1, 2):
        return _rle_problem(data, offset, abs(height), bits)
    return None


def _rle_problem(data: bytes, i: int, rows: int, bits: int) -> str | None:
    """What is wrong with the RLE8/RLE4 stream at ``data[i:]`` of an image of ``rows`` rows."""
    n, row = len(data), 0
    while i + 1 < n:
        count, code = data[i], data[i + 1]
        i += 2
        if count:  # a run
            continue
        if code == 0:
            row += 1
        elif code == 1:
            return None
        elif code == 2:  # a move: right, down
            row += data[i + 1] if i + 1 < n else 0
            i += 2
        else:  # literal pixels, padded to 16 bits
            size = code if bits == 8 else (code + 1) // 2
            i += size + (size & 1)
        if row > rows:
            return f"BMP RLE data run past the image's {rows} rows"
    return "BMP RLE data end without their end-of-bitmap code"


# --------------------------------------------------------------------------------------- WebP
def webp_problem(data: bytes, size: int | None = None) -> str | None:
    """What is broken in WebP ``data`` (RIFF chunk sizes when ``data`` is whole, the VP8/VP8L
    frame headers found); None when sound. ``size``: the file's size when ``data`` holds only
    its first bytes."""
    whole = size is None or len(data) == size
    end = min(_u32(data, 4, "little") + 8, len(data))
    i = 12
    while i + 8 <= end:
        kind, size = data[i : i + 4], _u32(data, i + 4, "little")
        if whole and i + 8 + size > end:
            return f"WebP chunk {kind!r} at byte {i} runs past the end of the file"
        problem = _frame_problem(kind, data[i + 8 : i + 8 + min(size, 16)])
        if problem:
            return f"{problem} (WebP chunk at byte {i})"
        i += 8 + size + (size & 1)
    return None


def _frame_problem(kind: bytes, head: bytes) -> str | None:
    """What is wrong with the first bytes of a VP8 or VP8L frame (other chunks: None)."""
    if not all(c == 0x20 or chr(c).isalnum() for c in kind):
        return f"not a RIFF chunk ({kind!r})"
    if (
        kind == b"VP8 "
        and len(head) >= 10
        and (
            head[0] & 1
            or head[3:6] != b"\x9d\x01\x2a"
            or not _u16(head, 6, "little") & 0x3FFF
            or not _u16(head, 8, "little") & 0x3FFF
        )
    ):
        return "VP8 frame that is not a key frame with its start code and a size"
    if kind == b"VP8L" and len(head) >= 5 and (head[0] != 0x2F or _u32(head, 1, "little") >> 29):
        return "VP8L frame without its signature"
    return None
