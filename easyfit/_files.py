"""Files written whole or not at all: what easyfit writes into a user's path (an export, a CSV
log, a plot, a marker) goes to a staging file beside it first and is renamed over the path once
complete, so a full disk or a kill mid-write never leaves the previous file truncated."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Mapping

__all__ = ["STAGING", "check_writable", "write_files"]

#: What the name of a staging file holds: ``.<name>.easyfit-tmp-<random>``, beside ``name``.
STAGING = ".easyfit-tmp-"


def _stage(target: str, data: bytes, sync: bool) -> str:
    """Writes ``data`` to a new staging file beside ``target`` (flushed to the disk with
    ``sync``, with the mode ``target`` has, or a new file's); returns its path, or removes it
    and raises."""
    if os.path.isdir(target):  # found now, not at the rename: the others stay unreplaced
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}{STAGING}{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        if os.path.exists(target):
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write_files(files: Mapping[str, bytes], sync: bool = True) -> None:
    """Writes each of ``files`` (``{path: content}``) whole, replacing what is there: every
    content is written to a staging file beside its path, and only once all are written are
    they renamed over their paths, so files written together (an export's function and its
    metadata) are never a new one beside an old one. A path that is a symbolic link has the
    file it points to replaced, as writing through the link would. ``sync=False`` leaves out
    the flush to the disk before the rename (for data sets of many small files: a failed write
    still replaces nothing, but a power cut may leave a recent file empty).

    Raises:
        OSError: a file could not be written (a full disk, a size limit, a folder that refuses
            writes), naming it; every file at ``files``' paths is then left as it was, and no
            staging file is left behind.

    Example:
        >>> import os
        >>> from easyfit._files import write_files
        >>> path = os.path.join(DOCS_TMP, "note.txt")
        >>> write_files({path: b"whole"})
        >>> open(path).read()
        'whole'
    """
    staged: dict[str, str] = {}
    path = ""
    try:
        for path, data in files.items():
            target = os.path.realpath(path)
            staged[target] = _stage(target, data, sync)
        for target, tmp in list(staged.items()):
            path = target
            os.replace(tmp, target)
            del staged[target]
    except OSError as e:
        raise _failed(path, e) from e
    finally:
        for tmp in staged.values():
            try:
                os.unlink(tmp)
            except OSError:
                pass


def check_writable(path: str) -> None:
    """Raises the OSError naming ``path`` that :func:`write_files` would raise for it now,
    before any content (a folder that refuses writes, a directory at ``path``): for a writer
    that writes later, to fail before the work whose results it would write. Writes nothing."""
    try:
        os.unlink(_stage(os.path.realpath(path), b"", sync=False))
    except OSError as e:
        raise _failed(path, e) from e


def _failed(path: str, e: OSError) -> OSError:
    reason = e.strerror or e
    return OSError(e.errno, f"{path}: not written ({reason}); the file there before is left as it was")
