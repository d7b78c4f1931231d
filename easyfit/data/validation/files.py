"""Checks of image files on disk (readable, not empty, and what a check of their bytes finds),
and the stamps that say when a checked file changed and must be checked again.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .encoded import HEAD, TAIL, WHOLE
from .urls import URL_SCHEMES

__all__ = ["file_problem", "file_stamp"]


def file_problem(path: str, check: Callable[..., str | None] | None = None) -> str | None:
    """Why file ``path`` cannot be read (or is empty), or what ``check(head, tail, size,
    data)`` finds wrong with its first :data:`HEAD` and last :data:`TAIL` bytes, and all of
    them (``data``, else None) when it is at most :data:`WHOLE` bytes; None when all is well.
    An ``s3://`` object is read by ranged GETs."""
    if path.startswith(URL_SCHEMES):  # an object: through object_store, imported only then
        from ..object_store import object_problem

        return object_problem(path, check, HEAD, TAIL, WHOLE)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return "empty file"
        if check is None:
            return None
        if size <= WHOLE:
            data = os.pread(fd, size, 0)
            return check(data[:HEAD], data[-TAIL:], size, data)
        return check(os.pread(fd, HEAD, 0), os.pread(fd, TAIL, size - TAIL), size, None)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
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
        st = os.stat(path)
    except OSError:
        return None
    return hash((st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns)) or 1
