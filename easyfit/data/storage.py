"""One door to storage: local paths and object storage (``s3://bucket/prefix``) behind one
interface, so that no other module asks which kind of path it holds.

:func:`storage_for` gives the :class:`Storage` of a path: :class:`LocalStorage` (the ``os``
module) or :class:`S3Storage` (boto3, through ``easyfit.data.object_store``). Each answers the
same questions: whether a path exists and is a folder, a folder's :class:`Listing` (its files,
with their sizes and stamps, and its sub-folders, from one listing call), a file's size and
stamp, its bytes (or a byte range of them), the file opened, and a host-side check of it.

A stamp is a number that changes when a file's content may have changed, equal in every
process for the same file (the checks of a file in a checker child and in the trainer agree):
from ``os.stat`` for a local file, from the size and ETag of a listed object.
"""

from __future__ import annotations

import abc
import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any, TypeVar

from ..errors import DataError
from . import object_store
from .validation.files import file_check, read_problem

__all__ = [
    "Entry",
    "Listing",
    "LocalStorage",
    "S3Storage",
    "Storage",
    "entries",
    "is_url",
    "listed",
    "stamp_of",
    "storage_for",
    "storage_of",
    "unfollowable",
]

_T = TypeVar("_T")
#: A check of a file's bytes: ``check(head, tail, size, data)`` -> the problem, or None.
Check = Callable[..., str | None] | None


def stamp_of(*parts: object) -> int:
    """A stamp (an int64, never 0) from ``parts`` (sizes, times, tags): a digest, equal in every
    process, where Python's ``hash`` of a string differs between them.

    Example:
        >>> from easyfit.data.storage import stamp_of
        >>> stamp_of(1024, '"9b2cf535f27731c9"') == stamp_of(1024, '"9b2cf535f27731c9"') != 0
        True
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True) or 1


def listed(folder: str) -> list[os.DirEntry]:
    """``os.scandir(folder)`` as a list; DataError naming ``folder`` when it cannot be listed."""
    try:
        with os.scandir(folder) as found:
            return list(found)
    except OSError as e:
        raise DataError(
            f"{folder}: cannot be listed ({e.strerror or e}); give the user who trains read "
            "and execute permission on it (chmod a+rx), or move it out of the data"
        ) from None


def _split(folder: str, found: list[os.DirEntry]) -> tuple[list[os.DirEntry], list[os.DirEntry]]:
    """``(files, folders)`` of a local listing, following symlinks; DataError naming an entry
    that cannot be followed."""
    files, dirs = [], []
    for entry in found:
        try:
            if entry.is_file():
                files.append(entry)
            elif entry.is_dir():
                dirs.append(entry)
            elif entry.is_symlink() and not os.path.exists(entry.path):
                os.stat(entry.path)  # raises: the loop's or the missing target's error
        except OSError as e:
            raise unfollowable(entry, e) from None
    return files, dirs


def unfollowable(entry: os.DirEntry, error: OSError) -> DataError:
    """The DataError for a local entry that cannot be followed (a link's loop, a missing
    target), naming it and, for a link, where it points."""
    link = f"; a symbolic link to {os.readlink(entry.path)!r}: fix or remove it" if entry.is_symlink() else ""
    return DataError(f"{entry.path}: cannot be followed ({error.strerror or error}){link}")


def entries(folder: str, kind: str = "file") -> list[os.DirEntry]:
    """The entries of local ``folder`` that are files (``kind="file"``) or directories
    (``"dir"``), following symlinks.

    Nothing is skipped without a word: DataError names ``folder`` when it cannot be listed (no
    read permission), and an entry that cannot be followed: a symlink loop, or a broken
    symlink (its target is gone), which would otherwise drop a sample silently.

    Example:
        >>> import os
        >>> from easyfit.data.storage import entries
        >>> os.symlink("loop", DOCS_TMP + "/loop")
        >>> entries(DOCS_TMP)
        Traceback (most recent call last):
        ...
        easyfit.errors.DataError: .../loop: cannot be followed (Too many levels of symbolic links)...
    """
    files, dirs = _split(folder, listed(folder))
    return files if kind == "file" else dirs


class Entry:
    """A file or a folder of a :class:`Listing`: its ``name`` and ``path``, and a file's
    ``size`` and ``stamp`` (a local file's from one ``os.stat``, made when first asked: a
    listing of many files stats none of them until a size is needed)."""

    __slots__ = ("_stat", "name", "path")

    def __init__(self, name: str, path: str, stat: tuple[int, int] | os.DirEntry | None = None):
        self.name, self.path = name, path
        self._stat = stat

    def _known(self) -> tuple[int, int]:
        if isinstance(self._stat, os.DirEntry):
            st = self._stat.stat()
            self._stat = (st.st_size, _local_stamp(st))
        return self._stat if self._stat is not None else (-1, 0)

    @property
    def size(self) -> int:
        """The file's size in bytes (-1 for a folder)."""
        return self._known()[0]

    @property
    def stamp(self) -> int:
        """The file's stamp (0 for a folder)."""
        return self._known()[1]

    def __repr__(self) -> str:
        return f"Entry({self.name!r})"


class Listing:
    """A folder's contents, listed once: ``files`` and ``dirs`` (:class:`Entry`), and the
    listings of its sub-folders (:meth:`child`) from the same storage."""

    def __init__(self, storage: Storage, path: str, files: list[Entry], dirs: list[Entry]):
        self.storage, self.path, self.files, self.dirs = storage, path, files, dirs

    def names(self) -> list[str]:
        """The names of the files."""
        return [e.name for e in self.files]

    def with_suffix(self, suffixes: tuple[str, ...]) -> list[Entry]:
        """The files whose names end with one of ``suffixes`` (any case), sorted by name."""
        return sorted((e for e in self.files if e.name.lower().endswith(suffixes)), key=lambda e: e.name)

    def child(self, name: str) -> Listing | None:
        """The listing of sub-folder ``name``; None when there is no such folder."""
        found = next((e for e in self.dirs if e.name == name), None)
        return None if found is None else self.storage.listdir(found.path)


class Storage(abc.ABC):
    """What easyfit asks of the place its data is kept. ``remote``: each read is a request over
    the network (reads are then run many at a time, :meth:`map`, and a file's host checks run in
    this process rather than in checker children, which read local files)."""

    remote = False

    @abc.abstractmethod
    def absolute(self, path: str) -> str:
        """``path`` made absolute (what names a file the same from any working directory)."""

    def exists(self, path: str) -> bool:
        """Whether ``path`` is a file or a folder."""
        return self.isfile(path) or self.isdir(path)

    @abc.abstractmethod
    def isdir(self, path: str) -> bool:
        """Whether ``path`` is a folder."""

    @abc.abstractmethod
    def isfile(self, path: str) -> bool:
        """Whether ``path`` is a file."""

    @abc.abstractmethod
    def listdir(self, path: str) -> Listing | None:
        """The files and folders in folder ``path``, from one listing; None when it is no folder."""

    @abc.abstractmethod
    def size(self, path: str) -> int:
        """The size of file ``path`` in bytes; -1 when it cannot be known."""

    @abc.abstractmethod
    def stamp(self, path: str) -> int | None:
        """File ``path``'s stamp (never 0): it changes when its bytes may have; None when the
        file cannot be stat'ed."""

    @abc.abstractmethod
    def read(self, path: str, start: int = 0, length: int | None = None) -> bytes:
        """The bytes of file ``path`` (``length`` bytes from ``start`` when given); DataError
        naming it when it cannot be read."""

    @abc.abstractmethod
    def open(self, path: str) -> IO[bytes]:
        """File ``path`` opened for reading, as a seekable binary file."""

    @abc.abstractmethod
    def check(self, path: str, check: Check = None) -> tuple[int | None, str | None]:
        """``(stamp, problem)`` of file ``path``: what ``easyfit.data.validation.files.file_check``
        says of a local file (why it cannot be read or is empty, or what ``check`` finds wrong
        with its bytes)."""

    def map(self, fn: Callable[[int], _T], items: Iterable[int]) -> list[_T]:
        """``[fn(i) for i in items]``, many at a time where each waits on the network."""
        return [fn(i) for i in items]


class LocalStorage(Storage):
    """Files on this machine's file systems, through ``os``."""

    def absolute(self, path: str) -> str:
        return os.path.abspath(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def isfile(self, path: str) -> bool:
        return os.path.isfile(path)

    def listdir(self, path: str) -> Listing | None:
        if not os.path.isdir(path):
            return None
        files, dirs = _split(path, listed(path))
        return Listing(
            self, path, [Entry(e.name, e.path, e) for e in files], [Entry(e.name, e.path) for e in dirs]
        )

    def size(self, path: str) -> int:
        try:
            return os.stat(path).st_size
        except OSError:
            return -1

    def stamp(self, path: str) -> int | None:
        try:
            return _local_stamp(os.stat(path))
        except OSError:
            return None

    def read(self, path: str, start: int = 0, length: int | None = None) -> bytes:
        try:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read() if length is None else f.read(length)
        except OSError as e:
            raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None

    def open(self, path: str) -> IO[bytes]:
        return open(path, "rb")

    def check(self, path: str, check: Check = None) -> tuple[int | None, str | None]:
        return file_check(path, check)


def _local_stamp(st: os.stat_result) -> int:
    """A local file's stamp: its size, modification time, inode and device (a rewrite, or a new
    file renamed over it; not a ``chmod``)."""
    return stamp_of(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


class S3Storage(Storage):
    """Objects in a bucket (``s3://bucket/prefix``), through ``easyfit.data.object_store``:
    a prefix's one listing answers for its "folders" and for its objects' sizes and ETags, and
    bytes are read by (ranged) GETs."""

    remote = True

    def absolute(self, path: str) -> str:
        return path

    def isdir(self, path: str) -> bool:
        return object_store.listing(path).isdir(path)

    def isfile(self, path: str) -> bool:
        return object_store.exists(path)

    def listdir(self, path: str) -> Listing | None:
        found = object_store.listing(path)
        if not found.isdir(path):
            return None
        files = [Entry(e.name, e.path, self._known(e.path)) for e in found.entries(path)]
        dirs = [Entry(e.name, e.path) for e in found.entries(path, "dir")]
        return Listing(self, path.rstrip("/"), files, dirs)

    @staticmethod
    def _known(path: str) -> tuple[int, int] | None:
        known = object_store.known(path)
        return None if known is None else (known[0], stamp_of(*known))

    def size(self, path: str) -> int:
        return object_store.size(path)

    def stamp(self, path: str) -> int | None:
        known = self._known(path)
        return None if known is None else known[1]

    def read(self, path: str, start: int = 0, length: int | None = None) -> bytes:
        return object_store.read_object(path, start, length)

    def open(self, path: str) -> IO[bytes]:
        return object_store.open_object(path)

    def check(self, path: str, check: Check = None) -> tuple[int | None, str | None]:
        try:
            size = self.size(path)
            if size < 0:
                size = len(self.read(path))
            return self.stamp(path), read_problem(size, lambda start, n: self.read(path, start, n), check)
        except DataError as e:
            return None, f"cannot be read ({str(e).removeprefix(path + ': ')})"

    def map(self, fn: Callable[[int], _T], items: Iterable[int]) -> list[_T]:
        return object_store.check_all(fn, items)


_LOCAL = LocalStorage()
_S3 = S3Storage()


def is_url(path: Any) -> bool:
    """Whether ``path`` names object storage (``s3://``, ``gs://``) rather than a local path:
    the one test of a path's scheme."""
    return isinstance(path, str) and path.startswith(object_store.SCHEMES)


def storage_for(path: str | os.PathLike) -> Storage:
    """The :class:`Storage` that holds ``path``: :class:`S3Storage` for ``s3://bucket/key``
    (``gs://``: a DataError that says how to read it), else :class:`LocalStorage`.

    Example:
        >>> from easyfit.data.storage import storage_for
        >>> type(storage_for("s3://bucket/data")).__name__, type(storage_for("/data")).__name__
        ('S3Storage', 'LocalStorage')
    """
    return _S3 if is_url(os.fspath(path)) else _LOCAL


def storage_of(paths: Sequence[str]) -> Storage:
    """The :class:`Storage` of a source's files (those of one source are kept in one place)."""
    return storage_for(paths[0]) if paths else _LOCAL
