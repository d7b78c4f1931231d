"""The loop of a checker child process (``easyfit.data.check_pool`` starts them): stamps and
checks the samples it is asked about and answers, on its stdin and stdout.

Protocol (little-endian). Once: ``<I length>`` and the check's name (a key of
:data:`~.samples.SAMPLE_CHECKS`; empty: the parent checks). Then per request: ``<Q n>``,
``<q max_pixels>`` (the parent's ``encoded.MAX_IMAGE_PIXELS``, -1 for None), ``<I columns>``,
n int64 expected stamps, and per column ``<I width>``, n int32 path lengths and the n paths
as rows of ``width`` bytes (a slice of the source's path table: the paths travel with their
request, so that a child holds none of a large folder's). A sample whose stamp
(:func:`~.samples.sample_stamp`) equals the expected one is not checked; any other is (one
expected as 0, never checked, is stamped from the files its check opens: one ``os.stat`` fewer
per file in a first epoch). The answer: n int64 stamps, n status bytes (:data:`UNCHANGED`,
:data:`FINE`, :data:`PROBLEM`, :data:`HERE`), then for each :data:`PROBLEM` ``<I length>``
and its UTF-8 text. The child ends at the end of its input.

:func:`serve_images` checks encoded images sent whole instead (records' images, which have no
file of their own): per request ``<Q n>``, ``<q max_pixels>``, n int64 lengths and the n
images' bytes, one after the other; the answer: n status bytes (:data:`FINE`,
:data:`PROBLEM`, :data:`HERE`), then each problem's text as above.

Standard library only: the child loads this package alone, under a private name, without
importing easyfit (or numpy, or JAX), so that it starts at once.
"""

from __future__ import annotations

import array
import os
import struct
import sys
from typing import IO

from . import encoded
from .samples import checked_sample, sample_problem, sample_stamp

__all__ = ["FINE", "HERE", "PROBLEM", "UNCHANGED", "read_exactly", "serve", "serve_images"]

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


def _ints(code: str, data: bytes) -> array.array:
    values = array.array(code)
    values.frombytes(data)
    if sys.byteorder != "little":  # pragma: no cover - little-endian machines only in practice
        values.byteswap()
    return values


def serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """Answers requests on ``stdin`` (see the module's docstring) until it ends."""
    (length,) = struct.unpack("<I", read_exactly(stdin, 4))
    check = read_exactly(stdin, length).decode()
    while True:
        try:
            n, max_pixels, columns = struct.unpack("<QqI", read_exactly(stdin, 20))
        except EOFError:
            return
        expected = _ints("q", read_exactly(stdin, 8 * n))
        rows = []
        for _ in range(columns):
            (width,) = struct.unpack("<I", read_exactly(stdin, 4))
            lengths = _ints("i", read_exactly(stdin, 4 * n))
            table = read_exactly(stdin, width * n)
            rows.append([os.fsdecode(table[j * width : j * width + lengths[j]]) for j in range(n)])
        encoded.MAX_IMAGE_PIXELS = None if max_pixels < 0 else max_pixels
        stamps = array.array("q")
        status = bytearray(n)
        texts = []
        for j in range(n):
            paths = [column[j] for column in rows]
            expect, stamp = expected[j], 0
            if expect or not check:  # else never checked: stamped as its check reads it
                stamp = sample_stamp(paths)
                if stamp != 0 and stamp == expect:
                    stamps.append(stamp)
                    continue
            if not check:
                stamps.append(stamp)
                status[j] = HERE
                continue
            try:
                if stamp:  # changed since its check
                    problem = sample_problem(check, paths)
                else:
                    stamp, problem = checked_sample(check, paths)
            except Exception:  # noqa: BLE001 - the parent checks it again, and raises
                stamps.append(stamp or sample_stamp(paths))
                status[j] = HERE
                continue
            stamps.append(stamp)
            status[j] = PROBLEM if problem else FINE
            if problem:
                text = problem.encode("utf-8", "surrogateescape")
                texts.append(struct.pack("<I", len(text)) + text)
        if sys.byteorder != "little":  # pragma: no cover
            stamps.byteswap()
        stdout.write(stamps.tobytes() + bytes(status) + b"".join(texts))
        stdout.flush()


def serve_images(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """Answers requests of encoded images (see the module's docstring) until ``stdin`` ends:
    :func:`~.encoded.image_problem` of each, its whole structure checked."""
    while True:
        try:
            n, max_pixels = struct.unpack("<Qq", read_exactly(stdin, 16))
        except EOFError:
            return
        lengths = _ints("q", read_exactly(stdin, 8 * n))
        data = memoryview(read_exactly(stdin, sum(lengths)))
        encoded.MAX_IMAGE_PIXELS = None if max_pixels < 0 else max_pixels
        status = bytearray(n)
        texts = []
        start = 0
        for j, length in enumerate(lengths):
            image = bytes(data[start : start + length])
            start += length
            try:
                problem = encoded.image_problem(image)
            except Exception:  # noqa: BLE001 - the parent checks it again, and raises
                status[j] = HERE
                continue
            status[j] = PROBLEM if problem else FINE
            if problem:
                text = problem.encode("utf-8", "surrogateescape")
                texts.append(struct.pack("<I", len(text)) + text)
        stdout.write(bytes(status) + b"".join(texts))
        stdout.flush()
