"""Checks of one encoded image from its bytes: its kind, whether it is whole, its size in pixels
against :data:`MAX_IMAGE_PIXELS`, and its structure (:mod:`easyfit.data.validation.structure`).
"""

from __future__ import annotations

import struct

from .jpeg import kept_size
from .structure import structure_problem

__all__ = [
    "HEAD",
    "MAX_IMAGE_PIXELS",
    "TAIL",
    "WHOLE",
    "encoded_problem",
    "header_channels",
    "header_size",
    "image_kind",
    "image_problem",
]

HEAD = 1 << 16  # bytes read from the start of an encoded image: its kind and header (a JPEG's
#                frame header comes after its EXIF segment, at most 64 KiB)
#: The most pixels (width x height) an image may have; a larger one raises DataError naming it
#: before DALI decodes it (a 32000x32000 PNG of 1 MB decodes to 3 GB). Pillow's
#: ``Image.MAX_IMAGE_PIXELS`` default (about 89.5 M pixels, 1 GiB of 24-bit RGB / 3 / 4).
#: Change it with ``easyfit.data.validation.encoded.MAX_IMAGE_PIXELS = n`` (None: no limit).
MAX_IMAGE_PIXELS: int | None = 1024 * 1024 * 1024 // 4 // 3
TAIL = 4096  # bytes read from the end of an encoded image to check it is complete
WHOLE = 1 << 20  # images up to this size are read whole to check their structure
_PNG_END = b"\0\0\0\0IEND\xaeB`\x82"
_SIGNATURES = {
    b"\xff\xd8\xff": "JPEG",
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"BM": "BMP",
    b"II*\0": "TIFF",
    b"MM\0*": "TIFF",
    b"\0\0\0\x0cjP  \r\n\x87\n": "JPEG 2000",
    b"\xffO\xffQ": "JPEG 2000",
}


def image_kind(head: bytes) -> str | None:
    """The kind of encoded image (``"JPEG"``, ``"PNG"``, ``"BMP"``, ``"WebP"``, ``"TIFF"``,
    ``"PNM"``, ``"JPEG 2000"``) its first bytes say, or None.

    Example:
        >>> from easyfit.data.validation.encoded import image_kind
        >>> image_kind(b"\\x89PNG\\r\\n\\x1a\\n"), image_kind(b"hello")
        ('PNG', None)
    """
    for signature, kind in _SIGNATURES.items():  # JPEG first: most files, at once
        if head.startswith(signature):
            return kind
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    if len(head) > 1 and head[0:1] == b"P" and head[1:2] in b"1234567":
        return "PNM"
    return None


def encoded_problem(head: bytes, tail: bytes, size: int, data: bytes | None = None) -> str | None:
    """Why bytes cannot be a whole encoded image, from their first :data:`HEAD` and last
    :data:`TAIL` bytes and their size, and from all of them (``data``) when given; None when
    they look sound.

    Recognises JPEG, PNG, BMP, WebP, TIFF, PNM and JPEG 2000; checks that JPEG,
    PNG, BMP and WebP data are complete (a JPEG's or PNG's end marker may be followed by a
    little more data, as some writers leave), BMP and WebP headers, and with ``data`` the
    structure of JPEG, PNG, BMP and WebP images (:mod:`easyfit.data.validation.structure`).

    Example:
        >>> from easyfit.data.validation.encoded import encoded_problem
        >>> encoded_problem(b"hello", b"hello", 5)
        "not an image (starts with b'hello')"
        >>> encoded_problem(b"\\x89PNG\\r\\n\\x1a\\n....", b"...", 2000)
        'truncated PNG (no IEND chunk at its end)'
    """
    if size == 0:
        return "empty file"
    kind = image_kind(head)
    if kind is None:
        return f"not an image (starts with {head[:8]!r})"
    if kind == "PNG" and tail.rfind(_PNG_END) < 0:
        return "truncated PNG (no IEND chunk at its end)"
    if kind == "JPEG" and tail.rfind(b"\xff\xd9") < 0:  # (from the end: found at once)
        return "truncated JPEG (no end-of-image marker)"
    if kind == "BMP" and len(head) >= 6 and int.from_bytes(head[2:6], "little") > size:
        return f"truncated BMP ({size} of {int.from_bytes(head[2:6], 'little')} bytes)"
    if kind == "WebP" and int.from_bytes(head[4:8], "little") + 8 > size:
        return f"truncated WebP ({size} of {int.from_bytes(head[4:8], 'little') + 8} bytes)"
    dims = header_size(kind, head)
    if MAX_IMAGE_PIXELS is not None and dims and dims[0] * dims[1] > MAX_IMAGE_PIXELS:
        return (
            f"{kind} of {dims[0]}x{dims[1]} pixels, more than MAX_IMAGE_PIXELS "
            f"({MAX_IMAGE_PIXELS}; see easyfit.data.validation.encoded.MAX_IMAGE_PIXELS)"
        )
    return structure_problem(kind, head if data is None else data, size)


def header_size(kind: str, head: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from the header of a PNG, BMP, WebP or JPEG (its frame header when
    ``head`` reaches it), else None.

    Example:
        >>> import struct
        >>> from easyfit.data.validation.encoded import header_size
        >>> header_size("PNG", b"\\x89PNG\\r\\n\\x1a\\n" + struct.pack(">I4sII", 13, b"IHDR", 640, 480))
        (640, 480)
    """
    if kind == "PNG" and len(head) >= 24:
        return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if kind == "BMP" and len(head) >= 26:
        if int.from_bytes(head[14:18], "little") == 12:  # BITMAPCOREHEADER: 16-bit sizes
            return int.from_bytes(head[18:20], "little"), int.from_bytes(head[20:22], "little")
        return (
            abs(int.from_bytes(head[18:22], "little", signed=True)),
            abs(int.from_bytes(head[22:26], "little", signed=True)),
        )
    if kind == "WebP" and len(head) >= 30:
        chunk = head[12:16]
        if chunk == b"VP8 ":
            return (
                int.from_bytes(head[26:28], "little") & 0x3FFF,
                int.from_bytes(head[28:30], "little") & 0x3FFF,
            )
        if chunk == b"VP8L":
            bits = int.from_bytes(head[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        if chunk == b"VP8X":
            return (int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1)
    if kind == "JPEG":
        known = kept_size(head)  # a header walked last: its frame's size, as found then
        if known is not None:
            return known
        i = _jpeg_frame(head)
        if i is not None:
            return int.from_bytes(head[i + 7 : i + 9], "big"), int.from_bytes(head[i + 5 : i + 7], "big")
    return None


def header_channels(kind: str, head: bytes) -> int | None:
    """The channels a JPEG (its frame header's components) or a PNG (its colour type) stores,
    when ``head`` tells them, else None: the channels DALI's ``peek_image_shape`` reports for
    ``ANY_DATA``.

    Example:
        >>> import struct
        >>> from easyfit.data.validation.encoded import header_channels
        >>> ihdr = struct.pack(">I4sIIBB", 13, b"IHDR", 640, 480, 8, 0)  # 8-bit grayscale
        >>> header_channels("PNG", b"\\x89PNG\\r\\n\\x1a\\n" + ihdr)
        1
    """
    if kind == "PNG" and len(head) >= 26:
        return _PNG_CHANNELS.get(head[25])
    if kind == "JPEG":
        i = _jpeg_frame(head)
        if i is not None and i + 10 <= len(head):
            return head[i + 9]
    return None


_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}  # by PNG colour type (3: a palette of RGB)


def _jpeg_frame(head: bytes) -> int | None:
    """Where a JPEG's frame header (its SOFn marker) starts in ``head``, or None."""
    i, n = 2, len(head) - 9
    while i <= n:
        ff, marker, length = _MARKER.unpack_from(head, i)
        if ff != 0xFF:
            return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return i
        i += 2 + length
    return None


_MARKER = struct.Struct(">BBH")  # a JPEG marker (FF, its code) and its segment's length


def image_problem(data: bytes, whole: bool = True) -> str | None:
    """:func:`encoded_problem` of an encoded image held in memory; its whole structure is
    checked when ``whole`` and it is at most :data:`WHOLE` bytes."""
    return encoded_problem(
        data[:HEAD], data[-TAIL:], len(data), data if whole and len(data) <= WHOLE else None
    )
