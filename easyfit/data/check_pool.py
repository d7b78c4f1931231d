"""Host checks of a streamed source's samples, run in checker child processes ahead of the feed.

The checks (``easyfit.data.validation``) are pure Python and would hold the GIL in DALI's feed
callback, so :class:`CheckPool` runs them in child processes, each with its own GIL, while the
parent waits on a pipe. A child loads ``easyfit.data.validation`` alone (standard library only,
see ``validation/child.py``), is told the check by name (a key of
``validation.samples.SAMPLE_CHECKS``), and answers requests of samples with their stamps and,
where a sample changed since it was last checked, what its check finds.

:meth:`CheckPool.ahead` sends the samples of the next batches to the children without waiting;
:meth:`CheckPool.problem`, called by the feed, reads the answers for its own samples. A sample
checked less than :data:`FRESH_SECONDS` before its feed is taken as checked; any other is stamped
again and checked again if its files changed, so a file replaced between epochs is checked before
DALI reads it.

Where no child can start (or one dies), or the source names no check, the checks run in this
process through the source's ``sample_problem``. Objects in a bucket (``s3://``) are checked by
concurrent reads (``easyfit.data.storage``). A check that raises in a child is run again
here, so that its exception is raised in this process.
"""

from __future__ import annotations

import collections
import os
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .._env import available_cores
from .storage import storage_for
from .validation import encoded
from .validation.child import FINE, HERE, PROBLEM, read_exactly
from .validation.samples import sample_stamp

__all__ = ["CHILDREN_SETTING", "FRESH_SECONDS", "CheckPool", "default_children", "image_problems"]

#: The environment variable that sets the checker children of each pool: a whole number, 0 to
#: check in this process; unset, :func:`default_children` chooses from the cores.
CHILDREN_SETTING = "EASYFIT_CHECKERS"

#: Loads ``easyfit.data.validation`` (its ``__init__.py``: argv[1]) under a private name,
#: without importing easyfit, and serves on stdin/stdout. Run with ``-I -S``: no folder of
#: the user's or site-packages on ``sys.path``.
_RUN = (
    "import importlib, importlib.util as u, os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"  # Ctrl-C is the parent's to handle
    "s = u.spec_from_file_location('_easyfit_validation', sys.argv[1],"
    " submodule_search_locations=[os.path.dirname(sys.argv[1])])\n"
    "m = u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m)\n"
    "importlib.import_module('_easyfit_validation.child').serve(sys.stdin.buffer, sys.stdout.buffer)\n"
)
_RUN_IMAGES = _RUN.replace(".serve(", ".serve_images(")  # the checks of images sent whole
_VALIDATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "validation", "__init__.py")
#: Seconds for which a check ahead stands for its sample's stat at its feed (a file replaced
#: in between is fed unchecked, as one replaced between its feed and DALI's read of it is):
#: the checks ahead are sent a few runs before the feed, and the feed would wait for a stat
#: queued behind the latest of them. Later, and at every feed after it, the sample is stat'ed.
FRESH_SECONDS = 1.0
_MIN_PER_CHILD = 32  # fewer samples per feed's request are not worth another child's round trip
_PIPE_BYTES = 1 << 20  # asked for a child's input pipe (Linux; else the default 64 KiB)

Problem = Callable[[int], "str | None"]


def default_children() -> int:
    """Checker children of a pool: ``EASYFIT_CHECKERS`` where it is set (0: check in this
    process), else half the machine's cores, 1 to 8 (the other half decodes and trains).

    Raises:
        ValueError: ``EASYFIT_CHECKERS`` is not a whole number of 0 or more.
    """
    given = os.environ.get(CHILDREN_SETTING, "").strip()
    if not given:
        return max(1, min(8, available_cores() // 2))
    if not given.isdigit():
        raise ValueError(
            f"{CHILDREN_SETTING}={given!r}: expected the number of checker processes per data "
            "source, a whole number (0: check the files in the training process)"
        )
    return int(given)


def image_problems(
    chunks: Iterable[tuple[Sequence[int], Sequence[bytes]]], children: int | None = None
) -> dict[int, str]:
    """``{index: problem}`` of encoded images held in memory (records' images, read by the
    caller), checked whole (``validation.encoded.image_problem``) by ``children`` checker
    processes (default: :func:`default_children`): each chunk of ``(indices, images)`` goes
    to the next free child while the caller reads the next chunk. In this process where no
    child can start or one dies."""
    count = default_children() if children is None else children
    found: dict[int, str] = {}
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            procs.append(_popen(_RUN_IMAGES))
    except OSError:  # no process can start: all here
        _end(procs)
        procs = []
    free = list(procs)
    pending: collections.deque[tuple[subprocess.Popen, _Images]] = collections.deque()
    try:
        for indices, images in chunks:
            work = _Images(list(indices), [bytes(image) for image in images])
            if not procs:
                work.check_here(found)
                continue
            try:
                if not free:  # one request at a time per child: its answer read first
                    proc, done = pending[0]
                    done.answer(proc, found)
                    pending.popleft()
                    free.append(proc)
                proc = free.pop()
                work.send(proc)
                pending.append((proc, work))
            except (OSError, EOFError, ValueError):  # a child is gone: the rest here
                _end(procs)
                procs, free = [], []
                for _, done in pending:
                    done.check_here(found)
                pending.clear()
                work.check_here(found)
        for proc, done in pending:
            try:
                done.answer(proc, found)
            except (OSError, EOFError, ValueError):
                done.check_here(found)
    finally:
        _end(procs)
    return found


class _Images:
    """A chunk of :func:`image_problems`: the images and their indices."""

    def __init__(self, indices: list[int], images: list[bytes]):
        self.indices, self.images = indices, images

    def send(self, proc: subprocess.Popen) -> None:
        """Writes the request of these images to child ``proc`` (``validation.child.serve_images``)."""
        limit = encoded.MAX_IMAGE_PIXELS
        lengths = np.array([len(image) for image in self.images], "<i8")
        assert proc.stdin is not None
        proc.stdin.write(struct.pack("<Qq", len(lengths), -1 if limit is None else limit) + lengths.tobytes())
        proc.stdin.write(b"".join(self.images))
        proc.stdin.flush()

    def answer(self, proc: subprocess.Popen, found: dict[int, str]) -> None:
        """Reads child ``proc``'s answer into ``found`` (what it could not check is checked here)."""
        assert proc.stdout is not None
        status = read_exactly(proc.stdout, len(self.indices))
        for j, code in enumerate(status):
            if code == PROBLEM:
                (size,) = struct.unpack("<I", read_exactly(proc.stdout, 4))
                found[self.indices[j]] = read_exactly(proc.stdout, size).decode("utf-8", "surrogateescape")
            elif code == HERE:
                _Images([self.indices[j]], [self.images[j]]).check_here(found)

    def check_here(self, found: dict[int, str]) -> None:
        """Checks the images in this process, into ``found``."""
        for i, image in zip(self.indices, self.images, strict=True):
            problem = encoded.image_problem(image)
            if problem:
                found[i] = problem


def _popen(run: str) -> subprocess.Popen:
    """A checker child running ``run`` (see :data:`_RUN`)."""
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", run, _VALIDATION],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


def _end(procs: list[subprocess.Popen]) -> None:
    """Ends checker processes (see :func:`_stop`)."""
    for proc in procs:
        for stream in (proc.stdin, proc.stdout):
            if stream is not None and not stream.closed:
                try:
                    stream.close()
                except OSError:  # what was left to write to a dead child
                    pass
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Child:
    """One checker process and the requests it has not answered yet (their sample indices,
    oldest first)."""

    def __init__(self, header: bytes):
        self.proc = _popen(_RUN)
        self.pending: collections.deque[tuple[np.ndarray, int]] = collections.deque()  # (indices, bytes)
        self.sent = 0  # requests sent so far (the next one's number)
        self.answered = 0  # answers read so far: request k is answered once this passes k
        self.room_bytes = _half_pipe(self.proc.stdin)
        self._send(header)

    def _send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def room(self, size: int) -> bool:
        """Whether a request of ``size`` bytes can be written now without waiting on answers:
        what the child has not answered yet stays within half its input pipe (so the pipe
        always takes the next request, also while the child waits on its answers being read),
        or the child has nothing left to answer (it is reading)."""
        return not self.pending or sum(b for _, b in self.pending) + size <= self.room_bytes

    def ask(self, indices: np.ndarray, request: bytes) -> int:
        """Sends ``request``, of the samples ``indices`` (see :meth:`room`): its number."""
        self._send(request)
        self.pending.append((indices, len(request)))
        self.sent += 1
        return self.sent - 1

    def answer(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """``(indices, stamps, status, problems)`` of the oldest pending request, once answered."""
        indices, _ = self.pending.popleft()
        self.answered += 1
        assert self.proc.stdout is not None
        n = len(indices)
        data = read_exactly(self.proc.stdout, 9 * n)
        stamps = np.frombuffer(data, "<i8", n).astype(np.int64)
        status = np.frombuffer(data, np.uint8, n, 8 * n)
        problems = []
        for _ in range(int((status == PROBLEM).sum())):
            (size,) = struct.unpack("<I", read_exactly(self.proc.stdout, 4))
            problems.append(read_exactly(self.proc.stdout, size).decode("utf-8", "surrogateescape"))
        return indices, stamps, status, problems


class CheckPool:
    """Checks of samples with the named ``check``, in ``children`` checker processes (default:
    :func:`default_children`; see the module's docstring). ``tables``: each column of a
    sample's paths (the images, then e.g. their masks) as ``(table, lengths)``, the byte table
    ``sources.folder.path_table`` makes. ``check`` None: the children only stamp, and the
    samples that need it are checked in this process. Everything runs in this process where
    ``children`` is 0, the paths are objects in a bucket, or no child can start.

    Remembers the stamp each sample was checked with: a sample is checked the first time it
    is asked about and again once its files changed (or cannot be stat'ed). Thread-safe.
    """

    def __init__(
        self,
        tables: Sequence[tuple[np.ndarray, np.ndarray]],
        check: str | None,
        children: int | None = None,
    ):
        self._tables = [(table, np.asarray(lengths, np.int32).reshape(-1)) for table, lengths in tables]
        n = len(self._tables[0][1])
        self._stamps = np.zeros(n, np.int64)  # as checked; 0: not checked
        self._asked = np.zeros(n, bool)  # sent ahead, not answered yet
        self._owner = np.zeros(n, np.int32)  # where sent ahead: the child (its place in _children)
        self._request = np.zeros(n, np.int64)  # ... and the number of its request there
        self._sent_at = np.full(n, -np.inf)  # when last sent ahead (time.monotonic()), until fed
        self._check = check
        self._count = default_children() if children is None else children
        self._lock = threading.Lock()
        self._children: list[_Child] = []
        self._remote: np.ndarray | None = None  # the objects' stamps, as listed
        self._storage = storage_for(self._path(0, 0))
        if self._storage.remote:  # checked here, by concurrent reads: no child reads them
            stamp = self._storage.stamp
            parts = [
                np.fromiter((stamp(self._path(k, i)) or 0 for i in range(n)), np.int64, n)
                for k in range(len(self._tables))
            ]
            self._remote = parts[0]
            for more in parts[1:]:
                self._remote = np.where((self._remote == 0) | (more == 0), 0, self._remote * 1_000_003 ^ more)
            self._count = 0
        weakref.finalize(self, _stop, self._children)
        self._start()

    def _path(self, column: int, index: int) -> str:
        table, lengths = self._tables[column]
        return os.fsdecode(table[index, : lengths[index]].tobytes())

    @property
    def children(self) -> int:
        """The checker processes running."""
        return len(self._children)

    def _start(self) -> None:
        """Starts the children, unless they run or none can (then ``_count`` is 0)."""
        if self._children or not self._count:
            return
        name = (self._check or "").encode()
        header = struct.pack("<I", len(name)) + name
        try:
            for _ in range(self._count):
                self._children.append(_Child(header))
        except OSError:  # no process can start (or its pipe broke at once)
            self._fail()

    def _fail(self) -> None:
        """Stops the children for good: every check runs in this process from now on (the
        answers they owe are lost, and those samples stay unchecked)."""
        _stop(self._children)
        self._children.clear()
        self._asked[:] = False
        self._count = 0

    def ahead(self, indices: np.ndarray) -> None:
        """Starts checking the samples of ``indices`` never checked yet, without waiting: what
        is found is kept for :meth:`problem` (nothing is raised here)."""
        if self._check is None:
            return
        with self._lock:
            self._start()
            if not self._children:
                return
            todo = np.unique(np.asarray(indices, np.int64))
            todo = todo[(self._stamps[todo] == 0) & ~self._asked[todo]]
            self._asked[todo] = True
            self._sent_at[todo] = time.monotonic()
            try:
                if len(todo):
                    self._ask(todo, spread=True)
            except (OSError, EOFError, ValueError):  # a child is gone
                self._fail()

    def problem(self, indices: np.ndarray, problem_of: Problem) -> tuple[int, str] | None:
        """Checks, and waits for, the samples of ``indices`` that need it (never checked,
        changed since their check, or that cannot be stat'ed): ``(index, problem)`` of the
        first, in the order of ``indices``, that has one; None when all are fine.
        ``problem_of(index)``: the sample's check in this process.

        A sample checked ahead (:meth:`ahead`) up to :data:`FRESH_SECONDS` before is taken on
        that check's stamp; every other is stat'ed again."""
        found = self.problems(indices, problem_of)
        first = next(iter(found), None)
        return None if first is None else (first, found[first])

    def problems(self, indices: np.ndarray, problem_of: Problem) -> dict[int, str]:
        """What :meth:`problem` checks, with every problem found: ``{index: problem}``, in the
        order of ``indices`` (what ``easyfit check`` lists)."""
        indices = np.asarray(indices, np.int64)
        found: dict[int, str] = {}
        with self._lock:
            self._start()
            here: dict[int, int] = {}  # index: stamp, to check in this process
            if self._children:
                try:
                    self._collect_ahead(indices, found)
                    fresh = self._stamps[indices] != 0
                    fresh &= self._sent_at[indices] >= time.monotonic() - FRESH_SECONDS
                    self._sent_at[indices] = -np.inf
                    due = indices[~fresh]
                    if len(due):
                        self._collect_own(self._ask(due), found, here)
                except (OSError, EOFError, ValueError):  # a child is gone
                    self._fail()
                    found.clear()
            if not self._children:
                stamps = [self._stamp_here(i) for i in indices.tolist()]
                here = {i: s for i, s in zip(indices.tolist(), stamps) if s == 0 or s != self._stamps[i]}
            due_here = list(here)
            problems = self._storage.map(problem_of, due_here)  # a bucket's GETs: waited on together
            for i, problem in zip(due_here, problems, strict=True):
                if problem:
                    found[i] = problem
                self._stamps[i] = 0 if problem else here[i]  # 0 where it cannot be stat'ed
        return {i: found[i] for i in indices.tolist() if i in found}

    def _ask(self, indices: np.ndarray, spread: bool = False) -> dict[int, int]:
        """Sends ``indices`` to the children, in contiguous parts, the least busy first: to
        every child when ``spread`` (checks ahead: each goes in a part as small as it can, so
        that all are done soon), else in parts of at least :data:`_MIN_PER_CHILD`. Returns the
        number of the request sent to each child (by its place in ``_children``)."""
        least = 1 if spread else _MIN_PER_CHILD
        parts = min(len(self._children), max(1, len(indices) // least))
        order = sorted(range(len(self._children)), key=lambda c: sum(b for _, b in self._children[c].pending))
        limit = encoded.MAX_IMAGE_PIXELS
        sent = {}
        for c, part in zip(order, np.array_split(indices, parts), strict=False):
            child = self._children[c]
            head = struct.pack("<QqI", len(part), -1 if limit is None else limit, len(self._tables))
            request = [head, self._stamps[part].astype("<i8").tobytes()]
            for table, lengths in self._tables:
                request += [struct.pack("<I", table.shape[1]), lengths[part].astype("<i4").tobytes()]
                request.append(np.ascontiguousarray(table[part]).tobytes())
            data = b"".join(request)
            while not child.room(len(data)):
                self._record(*child.answer(), {}, None)
            sent[c] = child.ask(part, data)
            if spread:  # where a feed finds the answers to its checks ahead
                self._owner[part], self._request[part] = c, sent[c]
        return sent

    def _collect_ahead(self, indices: np.ndarray, found: dict[int, str]) -> None:
        """Reads the answers to the checks ahead that hold samples of ``indices`` (and those
        sent before them to the same child, which answers in order), and no later ones."""
        waiting = self._asked[indices]
        if not waiting.any():
            return
        owners, requests = self._owner[indices[waiting]], self._request[indices[waiting]]
        for c in np.unique(owners):
            child: _Child = self._children[int(c)]
            last = int(requests[owners == c].max())
            while child.answered <= last:
                self._record(*child.answer(), found, {})

    def _collect_own(self, sent: dict[int, int], found: dict[int, str], here: dict[int, int]) -> None:
        """Reads the answers up to the requests ``sent`` (:meth:`_ask`); the samples of those
        to check in this process go to ``here``."""
        for c, last in sent.items():
            child = self._children[c]
            while child.answered < last:
                self._record(*child.answer(), found, {})
            self._record(*child.answer(), found, here)

    def _record(
        self,
        indices: np.ndarray,
        stamps: np.ndarray,
        status: np.ndarray,
        problems: list[str],
        found: dict[int, str],
        here: dict[int, int] | None,
    ) -> None:
        """Keeps a child's answer: the stamps of the samples found fine, the problems of the
        others in ``found``, and in ``here`` (when given) those to check in this process."""
        self._asked[indices] = False
        fine = status == FINE
        self._stamps[indices[fine]] = stamps[fine]
        bad = status == PROBLEM
        self._stamps[indices[bad]] = 0
        found.update(zip(indices[bad].tolist(), problems, strict=True))
        if here is not None:
            due = status == HERE
            here.update(zip(indices[due].tolist(), stamps[due].tolist(), strict=True))

    def _stamp_here(self, index: int) -> int:
        if self._remote is not None:
            return int(self._remote[index])
        return sample_stamp([self._path(k, index) for k in range(len(self._tables))])

    def close(self) -> None:
        """Stops the children; the next check starts them again."""
        with self._lock:
            _stop(self._children)
            self._children.clear()
            self._asked[:] = False  # their answers are lost: those samples stay unchecked


def _half_pipe(stream: object) -> int:
    """Half the capacity of pipe ``stream``, made larger first where the system allows; a
    page's half where it cannot be asked (not Linux)."""
    try:
        import fcntl

        fd = stream.fileno()  # type: ignore[attr-defined]
        try:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        except OSError:  # more than this user may have: as it is
            pass
        return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) // 2
    except (ImportError, AttributeError, OSError):
        return 2048


def _stop(children: list[_Child]) -> None:
    """Ends the children: their input closed (a child ends at its end) and their output (one
    still answering gets a broken pipe), then waited for, killed where one does not end."""
    _end([child.proc for child in children])
