"""The structure of a JPEG file, checked on the host (part of
:mod:`easyfit.data.validation.structure`): every marker segment's length and contents
(SOF, DHT, DQT, SOS, DRI), their order, and the markers inside entropy-coded data (only stuffed
``FF 00``, fill bytes and restart markers, in sequence and as many as the restart interval
implies) up to the end-of-image marker. The entropy-coded data itself is not decoded.
"""

from __future__ import annotations

import functools
import re
import threading

from ._bytes import ceil_div as _ceil
from ._bytes import u16 as _u16

__all__ = ["jpeg_problem", "kept_size"]

_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_LOSSLESS = frozenset({0xC3, 0xC7, 0xCB, 0xCF})
_ARITHMETIC = frozenset({0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_RST = frozenset(range(0xD0, 0xD8))
_IN_SCAN = re.compile(rb"\xff[^\x00]")  # a marker (or fill byte) inside entropy-coded data


class _Frame:
    """What a JPEG's SOF says, and the tables and restart interval defined so far."""

    def __init__(self) -> None:
        self.marker = 0
        self.size = (0, 0)  # height, width
        self.components: dict[int, tuple[int, int, int]] = {}  # id: (h, v, quant table)
        self.quant: set[int] = set()
        self.restart = 0
        self.scans = 0

    def copy(self) -> _Frame:
        """A frame that goes on from this one: a shallow copy, as the walk rebinds what it
        changes after the frame header (``quant``, ``restart``, ``scans``) rather than change
        it in place (``components`` is made once, by the frame header)."""
        frame = _Frame.__new__(_Frame)
        frame.__dict__ = self.__dict__.copy()
        return frame


#: The walks of recent files' headers (their bytes up to the end of the first scan header) to
#: their first scan: the frame and the scan header they found. A file whose first bytes are
#: one of these starts its walk at its first scan (files of one encoder, at one size and
#: quality, share their headers); the oldest goes first past :data:`_HEADERS_KEPT`.
_HEADERS: dict[bytes, tuple[_Frame, bytes]] = {}
_HEADERS_KEPT = 64
_HEADERS_LOCK = threading.Lock()
#: The kept header met last, as ``(its bytes, frame, scan header)``: a file that starts with
#: those bytes is known without finding its first scan and hashing the bytes up to it (most
#: files of a folder share one header). Rebound whole, so that a reader sees one header.
_last: tuple[bytes, _Frame, bytes] | None = None


def jpeg_problem(data: bytes) -> str | None:
    """What is broken in the structure of JPEG ``data``; None when it is sound.

    Example:
        >>> import io
        >>> from PIL import Image
        >>> buf = io.BytesIO()
        >>> Image.new("L", (8, 8)).save(buf, "JPEG")
        >>> jpeg_problem(buf.getvalue()) is None
        True
        >>> broken = buf.getvalue()[:4] + b"\\xff\\xff" + buf.getvalue()[6:]  # APP0's length
        >>> jpeg_problem(broken)
        'JPEG segment FFE0 at byte 2 has length 65535, past the end of the file (...)'
    """
    kept = _kept(data)
    if kept is None:
        return _walk(data, 2, _Frame(), _first_scan(data))
    first, frame, header = kept
    end = _scan_problem(data, len(first), frame, header)
    if isinstance(end, str):
        return end
    if data.startswith(b"\xff\xd9", end):  # one scan, then the end (a baseline JPEG)
        return None
    frame = frame.copy()  # the walk goes on (a progressive JPEG): its own frame
    frame.scans = 1
    return _walk(data, end, frame, b"")


def kept_size(head: bytes) -> tuple[int, int] | None:
    """``(width, height)`` of a JPEG whose first bytes ``head`` are the header met last by
    :func:`jpeg_problem` (its frame's size, as its walk found it), else None: what
    ``encoded.header_size`` would find, without walking the segments again."""
    last = _last
    if last is None or not head.startswith(last[0]):
        return None
    height, width = last[1].size
    return width, height


def _kept(data: bytes) -> tuple[bytes, _Frame, bytes] | None:
    """``(header bytes, frame, scan header)`` of the kept walk ``data`` starts with, or None."""
    global _last
    last = _last
    if last is not None and data.startswith(last[0]):
        return last
    first = _first_scan(data)
    seen = _HEADERS.get(first) if first else None
    if seen is None:
        return None
    _last = (first, *seen)
    return _last


def _first_scan(data: bytes) -> bytes:
    """``data`` up to the end of the first scan header its bytes hold (``FF DA``, then its
    length), or nothing: the key of :data:`_HEADERS`, which is the file's header only when its
    walk finds that scan there (a marker's bytes may also appear inside an earlier segment)."""
    at = data.find(b"\xff\xda")
    return data[: at + 2 + _u16(data, at + 2)] if 0 < at < len(data) - 3 else b""


def _walk(data: bytes, i: int, frame: _Frame, first: bytes) -> str | None:
    """:func:`jpeg_problem` from the marker at ``i`` on, with what ``frame`` found before;
    keeps the walk to the first scan in :data:`_HEADERS` when it ends at ``len(first)``."""
    n = len(data)
    while True:
        if i >= n or data[i] != 0xFF:
            return f"JPEG data where a marker should be (byte {i})"
        while i < n and data[i] == 0xFF:  # fill bytes may precede a marker
            i += 1
        if i >= n:
            return "truncated JPEG (ends in fill bytes)"
        marker, at = data[i], i - 1
        i += 1
        if marker == 0xD9:
            return None if frame.scans else "JPEG without image data (end marker before any scan)"
        if marker in _RST or marker == 0x01:
            continue
        if marker == 0xD8 or marker < 0xC0:
            return f"illegal marker FF{marker:02X} at byte {at}"
        length = _u16(data, i)
        if length < 2 or i + length > n:
            return (
                f"JPEG segment FF{marker:02X} at byte {at} has length {length}, past the "
                f"end of the file ({n} bytes)"
            )
        body = data[i + 2 : i + length]
        i += length
        problem = _segment_problem(marker, body, frame)
        if problem:
            return f"{problem} (JPEG segment FF{marker:02X} at byte {at})"
        if marker == 0xDA:
            if frame.scans == 0 and i == len(first):  # the header is what the key holds
                _keep(first, frame.copy(), body)
            frame.scans += 1
            end = _scan_problem(data, i, frame, body)
            if isinstance(end, str):
                return end
            i = end


def _keep(first: bytes, frame: _Frame, header: bytes) -> None:
    """Keeps the walk of a header to its first scan (see :data:`_HEADERS`)."""
    global _last
    with _HEADERS_LOCK:
        _HEADERS[first] = (frame, header)
        if len(_HEADERS) > _HEADERS_KEPT:
            del _HEADERS[next(iter(_HEADERS))]
    _last = (first, frame, header)


def _segment_problem(marker: int, body: bytes, frame: _Frame) -> str | None:
    """What is wrong with one marker segment's ``body``; updates ``frame``."""
    if marker in _SOF:
        return _sof_problem(marker, body, frame)
    if marker == 0xC4:
        return _dht_problem(bytes(body))
    if marker == 0xDB:
        return _dqt_problem(body, frame)
    if marker == 0xDD:
        if len(body) != 2:
            return "restart interval segment of a wrong length"
        frame.restart = _u16(body, 0)
    if marker == 0xDA:
        return _sos_problem(body, frame)
    return None  # APPn, COM, DNL, DAC, ...: free content


def _sof_problem(marker: int, body: bytes, frame: _Frame) -> str | None:
    if frame.marker:
        return "a second frame header"
    if len(body) < 6 or len(body) != 6 + 3 * body[5]:
        return "frame header of a wrong length"
    precision, height, width, count = body[0], _u16(body, 1), _u16(body, 3), body[5]
    if not 2 <= precision <= 16 or width == 0 or height == 0 or not 1 <= count <= 10:
        return f"frame header with precision {precision}, size {width}x{height}, {count} components"
    for k in range(count):
        ident, hv, quant = body[6 + 3 * k : 9 + 3 * k]
        if ident in frame.components or not (1 <= hv >> 4 <= 4 and 1 <= hv & 15 <= 4) or quant > 3:
            return f"frame header: component {k} is invalid"
        frame.components[ident] = (hv >> 4, hv & 15, quant)
    frame.marker, frame.size = marker, (height, width)
    return None


@functools.lru_cache(maxsize=64)  # images of one encoder share their Huffman tables
def _dht_problem(body: bytes) -> str | None:
    i = 0
    while i < len(body):
        kind, counts = body[i], body[i + 1 : i + 17]
        values = body[i + 17 : i + 17 + sum(counts)]
        if (
            kind >> 4 > 1
            or kind & 15 > 3
            or len(counts) < 16
            or len(values) < sum(counts)
            or sum(counts) > 256
        ):
            return "Huffman table segment of a wrong length or table id"
        code, left = 0, sum(counts)
        for bits, count in enumerate(counts, 1):
            if not left:
                break
            code, left = code + count, left - count
            if code >= 1 << bits:  # as libjpeg checks: more codes than the lengths allow
                return "Huffman table with more codes than their lengths allow"
            code <<= 1
        if kind >> 4 == 0 and values and max(values) > 16:
            return "DC Huffman table with a symbol above 16"
        i += 17 + sum(counts)
    return None


def _dqt_problem(body: bytes, frame: _Frame) -> str | None:
    i = 0
    while i < len(body):
        wide, table = body[i] >> 4, body[i] & 15
        size = 128 if wide else 64
        values = body[i + 1 : i + 1 + size]
        if wide > 1 or table > 3 or len(values) < size:
            return "quantization table segment of a wrong length or table id"
        if 0 in (values if not wide else [values[k] << 8 | values[k + 1] for k in range(0, size, 2)]):
            return f"quantization table {table} holds a zero"
        frame.quant = frame.quant | {table}  # rebound: a kept frame's set stays as it is
        i += 1 + size
    return None


def _sos_problem(body: bytes, frame: _Frame) -> str | None:
    if not frame.marker:
        return "scan before the frame header"
    if not body or not 1 <= body[0] <= 4 or len(body) != 4 + 2 * body[0]:
        return "scan header of a wrong length"
    ids = body[1 : 1 + 2 * body[0] : 2]
    if any(c not in frame.components for c in ids) or len(set(ids)) != len(ids):
        return "scan header names a component the frame does not have"
    missing = {frame.components[c][2] for c in ids} - frame.quant
    if missing and frame.marker not in _LOSSLESS:
        return f"quantization table {missing.pop()} is not defined before the scan"
    start, end = body[-3], body[-2]
    if frame.marker not in _LOSSLESS and not start <= end <= 63:
        return f"scan header with spectral selection {start}..{end}"
    return None


def _scan_problem(data: bytes, i: int, frame: _Frame, header: bytes) -> int | str:
    """The offset of the marker ending the entropy-coded data that starts at ``i``, or what is
    wrong in it: a marker other than a restart marker, restart markers out of sequence, or not
    as many as the restart interval implies. ``frame`` is only read."""
    restarts = 0
    for m in _IN_SCAN.finditer(data, i):
        p = m.start()
        if p and data[p - 1] == 0xFF:  # part of a run of fill bytes already seen
            continue
        q = p
        while q < len(data) and data[q] == 0xFF:
            q += 1
        if q < len(data) and data[q] == 0x00:  # fill bytes, then a stuffed zero: still data
            continue
        marker = data[q] if q < len(data) else -1
        if marker not in _RST:
            expected = _restarts(frame, header)
            if expected is not None and restarts != expected:
                return (
                    f"{restarts} restart markers in the scan ending at byte {p}, the "
                    f"restart interval implies {expected}"
                )
            return p
        if not frame.restart:
            return f"restart marker FF{marker:02X} at byte {p} without a restart interval"
        if marker != 0xD0 + restarts % 8:
            return f"restart marker FF{marker:02X} at byte {p} out of sequence"
        restarts += 1
    return "truncated JPEG (its last scan has no end)"


def _restarts(frame: _Frame, header: bytes) -> int | None:
    """Restart markers the scan with ``header`` holds, or None when not known."""
    if not frame.restart or frame.marker in _LOSSLESS:
        return None
    (height, width), comps = frame.size, frame.components
    hmax = max(h for h, _, _ in comps.values())
    vmax = max(v for _, v, _ in comps.values())
    ids = header[1 : 1 + 2 * header[0] : 2]
    if len(ids) == 1:  # one component: its blocks, not MCUs
        h, v, _ = comps[ids[0]]
        cols, rows = _ceil(_ceil(width * h, hmax), 8), _ceil(_ceil(height * v, vmax), 8)
    else:
        cols, rows = _ceil(width, 8 * hmax), _ceil(height, 8 * vmax)
    return (cols * rows - 1) // frame.restart
