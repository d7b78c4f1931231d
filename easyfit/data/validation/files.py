"""Checks of image files on disk (readable, not empty, and what a check of their bytes finds),
and the stamps that say when a checked file changed and must be checked again.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .encoded import HEAD, TAIL, WHOLE

__all__ = ["file_check", "file_problem", "file_stamp", "read_problem"]


def file_problem(path: str, check: Callable[..., str | None] | None = None) -> str | None:
    """Why file ``path`` cannot be read (or is empty), or what ``check(head, tail, size,
    data)`` finds wrong with its first :data:`HEAD` and last :data:`TAIL` bytes, and all of
    them (``data``, else None) when it is at most :data:`WHOLE` bytes; None when all is well."""
    return file_check(path, check)[1]


def file_check(path: str, check: Callable[..., str | None] | None = None) -> tuple[int | None, str | None]:
    """``(stamp, problem)``: :func:`file_problem`, and the :func:`file_stamp` of the file it
    read (from the open file: no second ``os.stat``; None where it could not be read). A
    local file: files elsewhere are read by their storage (``easyfit.data.storage``), which
    hands their bytes to :func:`read_problem`."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    try:
        st = os.fstat(fd)
        return _stamp(st), read_problem(st.st_size, lambda start, n: os.pread(fd, n, start), check)
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    finally:
        os.close(fd)


def read_problem(
    size: int, read: Callable[[int, int], bytes], check: Callable[..., str | None] | None
) -> str | None:
    """What :func:`file_problem` says of a file of ``size`` bytes whose bytes ``read(start,
    length)`` gives (wherever it is kept): empty, or what ``check(head, tail, size, data)``
    finds wrong with its first :data:`HEAD` and last :data:`TAIL` bytes (and all of them when
    it is at most :data:`WHOLE` bytes: one read, else two)."""
    if size == 0:
        return "empty file"
    if check is None:
        return None
    if size <= WHOLE:
        data = read(0, size)
        return check(data[:HEAD], data[-TAIL:], size, data)
    return check(read(0, HEAD), read(size - TAIL, TAIL), size, None)


def file_stamp(path: str) -> int | None:
    """A number that changes when file ``path`` is written or replaced (from its size, inode,
    device, modification and status-change times: ``os.stat``, no read), never 0; None when
    it cannot be stat'ed. What sources compare to check a file again once it changed after its
    check. A local file's: what checker children stamp (``easyfit.data.storage`` stamps the
    others)."""
    try:
        return _stamp(os.stat(path))
    except OSError:
        return None


def _stamp(st: os.stat_result) -> int:
    return hash((st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns)) or 1
