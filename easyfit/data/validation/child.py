"""The loop of a checker child process (``easyfit.data.check_pool`` starts them): stamps and
checks the samples it is asked about and answers, on its stdin and stdout.

Protocol (little-endian). Once: ``<Q size>`` and the paths of every column, joined by ``\\0``
(column after column, each as long as the first), ``<I columns>``, ``<I length>`` and the
check's name (a key of :data:`~.samples.SAMPLE_CHECKS`; empty: the parent checks). Then per
request: ``<Q n>``, ``<q max_pixels>`` (the parent's ``encoded.MAX_IMAGE_PIXELS``, -1 for
None), n int64 sample indices and n int64 expected stamps. A sample whose stamp
(:func:`~.samples.sample_stamp`) equals the expected one is not checked; any other is. The
answer: n int64 stamps, n status bytes (:data:`UNCHANGED`, :data:`FINE`, :data:`PROBLEM`,
:data:`HERE`), then for each :data:`PROBLEM` ``<I length>`` and its UTF-8 text. The child
ends at the end of its input.

Standard library only: the child loads this package alone, under a private name, without
importing easyfit (or numpy, or JAX), so that it starts at once.
"""

from __future__ import annotations

import array
import struct
import sys
from typing import IO

from . import encoded
from .samples import sample_problem, sample_stamp

__all__ = ["FINE", "HERE", "PROBLEM", "UNCHANGED", "read_exactly", "serve"]

UNCHANGED = 0  #: stamped as expected: not checked
FINE = 1  #: checked: nothing wrong
PROBLEM = 2  #: checked: a problem, whose text follows
#: to check in the parent: the child has no check (it was sent none), or the check raised
#: (the parent runs it again, so that the exception is raised there)
HERE = 3


def read_exactly(stream: IO[bytes], n: int) -> bytes:
    """``n`` bytes of ``stream``; EOFError when it ends before."""
    data = stream.read(n)
    if len(data) != n:
        raise EOFError
    return data


def _int64s(data: bytes) -> array.array:
    values = array.array("q")
    values.frombytes(data)
    if sys.byteorder != "little":  # pragma: no cover - little-endian machines only in practice
        values.byteswap()
    return values


def serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """Answers requests on ``stdin`` (see the module's docstring) until it ends."""
    (size,) = struct.unpack("<Q", read_exactly(stdin, 8))
    flat = read_exactly(stdin, size).decode("utf-8", "surrogateescape").split("\0")
    columns, length = struct.unpack("<II", read_exactly(stdin, 8))
    check = read_exactly(stdin, length).decode()
    n_samples = len(flat) // columns
    rows = [flat[k * n_samples : (k + 1) * n_samples] for k in range(columns)]
    while True:
        try:
            n, max_pixels = struct.unpack("<Qq", read_exactly(stdin, 16))
        except EOFError:
            return
        indices = _int64s(read_exactly(stdin, 8 * n))
        expected = _int64s(read_exactly(stdin, 8 * n))
        encoded.MAX_IMAGE_PIXELS = None if max_pixels < 0 else max_pixels
        stamps = array.array("q")
        status = bytearray(n)
        texts = []
        for j, i in enumerate(indices):
            paths = [column[i] for column in rows]
            stamp = sample_stamp(paths)
            stamps.append(stamp)
            if stamp != 0 and stamp == expected[j]:
                continue
            if not check:
                status[j] = HERE
                continue
            try:
                problem = sample_problem(check, paths)
            except Exception:  # noqa: BLE001 - the parent checks it again, and raises
                status[j] = HERE
                continue
            status[j] = PROBLEM if problem else FINE
            if problem:
                text = problem.encode("utf-8", "surrogateescape")
                texts.append(struct.pack("<I", len(text)) + text)
        if sys.byteorder != "little":  # pragma: no cover
            stamps.byteswap()
        stdout.write(stamps.tobytes() + bytes(status) + b"".join(texts))
        stdout.flush()
