"""Checks of image files on disk (readable, not empty, and what a check of their bytes finds),
and the stamps that say when a checked file changed and must be checked again.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .encoded import HEAD, TAIL, WHOLE
from .urls import URL_SCHEMES

__all__ = ["file_check", "file_problem", "file_stamp"]


def file_problem(path: str, check: Callable[..., str | None] | None = None) -> str | None:
    """Why file ``path`` cannot be read (or is empty), or what ``check(head, tail, size,
    data)`` finds wrong with its first :data:`HEAD` and last :data:`TAIL` bytes, and all of
    them (``data``, else None) when it is at most :data:`WHOLE` bytes; None when all is well.
    An ``s3://`` object is read by ranged GETs."""
    return file_check(path, check)[1]


def file_check(path: str, check: Callable[..., str | None] | None = None) -> tuple[int | None, str | None]:
    """``(stamp, problem)``: :func:`file_problem`, and the :func:`file_stamp` of the file it
    read (from the open file: no second ``os.stat``; None where it could not be read)."""
    if path.startswith(URL_SCHEMES):  # an object: through object_store, imported only then
        from ..object_store import object_problem
        from ..object_store import stamp as object_stamp

        return object_stamp(path), object_problem(path, check, HEAD, TAIL, WHOLE)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    try:
        st = os.fstat(fd)
        stamp, size = _stamp(st), st.st_size
        if size == 0:
            return stamp, "empty file"
        if check is None:
            return stamp, None
        if size <= WHOLE:
            data = os.pread(fd, size, 0)
            return stamp, check(data[:HEAD], data[-TAIL:], size, data)
        return stamp, check(os.pread(fd, HEAD, 0), os.pread(fd, TAIL, size - TAIL), size, None)
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    finally:
        os.close(fd)


def file_stamp(path: str) -> int | None:
    """A number that changes when file ``path`` is written or replaced (from its size, inode,
    device, modification and status-change times: ``os.stat``, no read), never 0; None when
    it cannot be stat'ed. What sources compare to check a file again once it changed after its
    check. An ``s3://`` object's comes from its size and ETag, as listed."""
    if path.startswith(URL_SCHEMES):  # an object: through object_store, imported only then
        from ..object_store import stamp

        return stamp(path)
    try:
        return _stamp(os.stat(path))
    except OSError:
        return None


def _stamp(st: os.stat_result) -> int:
    return hash((st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns)) or 1
