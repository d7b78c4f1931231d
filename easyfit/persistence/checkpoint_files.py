"""What keeps checkpoints trustworthy: checksums, one writer at a time, and the atomic swap.

* :func:`digests` hashes every array of a pytree (BLAKE2b of its dtype, shape and bytes, read
  from the host) under its key path; :func:`json_digest` hashes JSON metadata. A checkpoint
  carries them in an item of its own, written at save time and checked at load time.
* :class:`WriterLock` holds ``<path>.lock`` (``fcntl.flock``; the file is removed as the lock
  is let go) while a process writes at ``path``; a second writer gets a
  :class:`~easyfit.errors.CheckpointError` at once. With several processes only process 0
  locks, and the others learn the outcome from it.
* :func:`stage` makes the directory Orbax writes a new checkpoint into (``.easyfit-tmp-<hash>``
  beside ``path``, or in the nearest ancestor whose path has no glob characters: Orbax globs
  for its OCDBT parts, so ``[`` and ``]`` in the path would lose them); :func:`swap_in` moves
  the complete checkpoint to ``<path>.easyfit-new`` and then in place of the old one with
  directory renames (old -> ``<path>.easyfit-old``, new -> ``path``); :func:`resolve` finds
  the complete one when a kill fell between the two renames, and :func:`recover` puts it back
  in place.
* Ownership: easyfit deletes, renames or replaces only what carries a marker it wrote: the
  file :data:`MARKER` in every checkpoint (:func:`owned`; a checkpoint of an easyfit from
  before the marker is known by its own ``metadata`` item), :data:`STAGING_MARKER` in a
  staging directory. :func:`check_target` refuses a ``path`` that holds anything else.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
from typing import Any

import jax
import numpy as np

from .._files import write_files
from ..errors import CheckpointError

NEW, OLD = ".easyfit-new", ".easyfit-old"
#: The item of a checkpoint that holds the checksums.
ITEM = "checksums"
#: The ``format`` of a checkpoint's metadata item.
FORMAT = "easyfit-checkpoint"
#: The file easyfit writes into every checkpoint directory: what it may replace or delete.
MARKER = "EASYFIT_CHECKPOINT"
#: The file easyfit writes into a staging directory it made.
STAGING_MARKER = "EASYFIT_STAGING"


def _host(leaf: Any) -> np.ndarray:
    if isinstance(leaf, jax.Array):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        if leaf.is_fully_replicated or leaf.is_fully_addressable:
            return np.asarray(leaf.addressable_data(0) if leaf.is_fully_replicated else leaf)
        from jax.experimental import multihost_utils  # every process calls save: a collective

        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    return np.asarray(leaf)


def _digest(array: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{array.dtype.str}{array.shape}".encode())
    h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def _name(entry: Any) -> str:
    for field in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
        if hasattr(entry, field):
            return str(getattr(entry, field))
    return str(entry)


def digests(tree: Any) -> dict[str, str]:
    """``{key path: checksum}`` of every array leaf of ``tree``; the paths are the same whether
    the tree holds dataclasses and tuples or, as Orbax reads it back, dicts and lists."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {"/".join(_name(e) for e in path): _digest(_host(leaf)) for path, leaf in flat}


def json_digest(value: Any) -> str:
    """The checksum of a JSON value (as JSON stores it: keys sorted, tuples as lists)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def check(path: str, item: str, tree: Any, saved: dict[str, str], every: bool = False) -> None:
    """Raises CheckpointError naming ``path``, ``item`` and the leaf whose arrays differ from the
    checksums written at save time (``every``: the tree must hold every leaf saved)."""
    got_all = digests(tree)
    if every and saved.keys() - got_all.keys():
        missing = sorted(saved.keys() - got_all.keys())[0]
        raise CheckpointError(f"{path}: item {item!r} lacks its array {missing}, the checkpoint is damaged")
    for leaf, got in got_all.items():
        want = saved.get(leaf)
        if want is None:
            raise CheckpointError(
                f"{path}: item {item!r} has an array {leaf} that the "
                f"checkpoint's checksums do not list (saved from another "
                f"model or optimizer?)"
            )
        if got != want:
            raise CheckpointError(
                f"{path}: item {item!r}, array {leaf}: checksum mismatch, the checkpoint is damaged"
            )


def _all_processes_agree(ok: bool) -> bool:
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.int32(ok)))


def _lock_file_or_none(path: str) -> bool:
    """Whether ``path`` is absent or looks like a lock file easyfit wrote (empty, or a process
    id and a newline: one a killed writer left): the lock may take it over and remove it."""
    if not os.path.lexists(path):
        return True
    if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 32:
        return False
    with open(path, "rb") as f:
        text = f.read()
    return text == b"" or text.rstrip(b"\n").isdigit()


class WriterLock:
    """An exclusive ``fcntl.flock`` on ``<path>.lock`` (process 0's, for several processes):
    a second holder, in this process or another, gets a CheckpointError naming ``path``."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.file = self.path + ".lock"
        self._fd: int | None = None  # process 0's
        self._held = False  # every process's view (acquire is collective: all or none return)

    def acquire(self) -> WriterLock:
        if self._held:
            return self
        ok = True
        foreign = jax.process_index() == 0 and not _lock_file_or_none(self.file)
        if foreign:
            ok = False
        elif jax.process_index() == 0:
            os.makedirs(os.path.dirname(self.file), exist_ok=True)
            while True:
                fd = os.open(self.file, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    ok = False
                    break
                try:  # the holder before us may have removed the file as it let go: lock anew
                    same = os.stat(self.file).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    os.ftruncate(fd, 0)
                    os.write(fd, f"{os.getpid()}\n".encode())
                    self._fd = fd
                    break
                os.close(fd)
        if not _all_processes_agree(ok):
            self.release()
            if foreign:
                raise CheckpointError(
                    f"{self.path}: {self.file} exists and is not an easyfit lock file (those hold "
                    f"a process id); easyfit would replace it, so it stops: move it away, or "
                    f"use another path"
                )
            raise CheckpointError(
                f"{self.path}: another writer holds {self.file} (another "
                f"program saving here now); use another path, or wait "
                f"for it to finish"
            )
        self._held = True
        return self

    def release(self) -> None:
        self._held = False
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.unlink(self.file)  # while still held: see acquire
            except FileNotFoundError:
                pass
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __del__(self) -> None:
        self.release()

    def __enter__(self) -> WriterLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def complete(path: str) -> bool:
    """Whether ``path`` is a checkpoint that Orbax finished writing (its rename happened)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "_CHECKPOINT_METADATA"))


def write_marker(path: str, name: str = MARKER, **fields: Any) -> None:
    """Writes the marker file ``name`` (JSON) into the directory ``path``."""
    write_files({os.path.join(path, name): json.dumps({"format": FORMAT, **fields}).encode()})


def owned(path: str) -> bool:
    """Whether the directory ``path`` (not a link) is a checkpoint easyfit wrote: it holds
    :data:`MARKER`, or (written before the marker) a ``metadata`` item of easyfit's format."""
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    if os.path.isfile(os.path.join(path, MARKER)):
        return True
    try:
        with open(os.path.join(path, "metadata", "metadata")) as f:
            return json.load(f).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _refuse(path: str, what: str) -> CheckpointError:
    return CheckpointError(
        f"{path}: {what}; easyfit replaces only checkpoints it wrote (a directory holding "
        f"{MARKER}), so it leaves it as it is: save to another path, or move it away first"
    )


def check_target(path: str) -> None:
    """Raises CheckpointError unless ``path`` and its two swap siblings are absent, empty
    directories, or checkpoints easyfit wrote (nothing else is ever replaced)."""
    for where in (path, path + NEW, path + OLD):
        if os.path.islink(where):
            raise _refuse(where, "is a symbolic link, not an easyfit checkpoint")
        if not os.path.exists(where):
            continue
        if not os.path.isdir(where):
            raise _refuse(where, "is a file, not an easyfit checkpoint")
        if os.listdir(where) and not owned(where):
            raise _refuse(where, "is a directory that is not an easyfit checkpoint")


def staging_dir(path: str) -> str:
    """Where a new checkpoint for ``path`` is written: ``.easyfit-tmp-<hash of path>`` in the
    nearest ancestor of ``path`` whose path has no glob characters (Orbax globs its own paths)."""
    parent = os.path.dirname(path)
    while glob.has_magic(parent):
        parent = os.path.dirname(parent)
    tag = hashlib.blake2b(path.encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()
    return os.path.join(parent, f".easyfit-tmp-{tag}")


def _remove_staging(where: str) -> None:
    if not os.path.lexists(where):
        return
    if os.path.islink(where) or not os.path.isfile(os.path.join(where, STAGING_MARKER)):
        raise _refuse(where, "is in the way of a save's staging directory and was not made by easyfit")
    shutil.rmtree(where)


def stage(path: str) -> str:
    """Makes (afresh, marked) the directory a new checkpoint for ``path`` is written into;
    returns the path Orbax writes the checkpoint to, inside it (process 0, holding the lock).

    Raises:
        CheckpointError: the staging directory cannot be renamed onto ``path`` (another
            filesystem: a path with ``[`` or ``]`` below a mount point).
    """
    where = staging_dir(path)
    _remove_staging(where)
    parent = os.path.dirname(path)
    if os.stat(os.path.dirname(where)).st_dev != os.stat(parent).st_dev:
        raise CheckpointError(
            f"{path}: Orbax cannot write below a path containing '[' or ']', and "
            f"{os.path.dirname(where)} (where easyfit would write it first) is on another "
            f"filesystem than {parent}; save to a path without brackets"
        )
    os.mkdir(where)
    write_marker(where, STAGING_MARKER, target=path)
    return os.path.join(where, "checkpoint")


def staged(path: str) -> str:
    """The path Orbax writes the new checkpoint for ``path`` to (every process)."""
    return os.path.join(staging_dir(path), "checkpoint")


def resolve(path: str) -> str:
    """``path``, or the complete copy a save killed between its two renames left beside it."""
    if os.path.exists(path):
        return path
    for sibling in (path + NEW, path + OLD):  # the newer first
        if complete(sibling) and owned(sibling):
            return sibling
    return path


def recover(path: str) -> None:
    """Puts the complete copy back at ``path`` (a save was killed between its renames) and
    removes what is left of unfinished saves, each known by its marker. Call it holding the
    writer lock, on process 0, after :func:`check_target`."""
    found = resolve(path)
    if found != path:
        os.rename(found, path)
    for leftover in (path + NEW, path + OLD):
        if os.path.isdir(leftover):  # check_target let it through: empty, or ours
            shutil.rmtree(leftover)
    _remove_staging(staging_dir(path))


def swap_in(path: str) -> None:
    """Replaces ``path`` with the complete checkpoint Orbax wrote into the staging directory
    (process 0, holding the lock): it is marked, moved to ``<path>.easyfit-new``, then at every
    instant a complete checkpoint is at ``path``, ``<path>.easyfit-old`` or
    ``<path>.easyfit-new``."""
    new = staged(path)
    write_marker(new)
    os.rename(new, path + NEW)
    _remove_staging(staging_dir(path))
    if os.path.exists(path):  # an easyfit checkpoint or an empty directory (check_target)
        os.rename(path, path + OLD)
    os.rename(path + NEW, path)
    if os.path.isdir(path + OLD):
        shutil.rmtree(path + OLD)
