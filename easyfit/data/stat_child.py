"""The state of files, stat'ed in a child process: what a streamed folder compares, batch by
batch, to check a file again once it changed after its check.

Why a process: ``os.stat`` releases the GIL, and a thread that stats each file of a batch
hands the GIL back and forth with the training loop once per file; that handing, not the
system call, is what it costs. The child stats a whole batch and answers with one array, two
pipe transfers per batch. Run as a script (``python stat_child.py``), it imports no easyfit
package. Protocol on its stdin/stdout: the paths once (``<u8 bytes>`` then the paths joined by
``\\0``), then per request ``<u8 n>`` and n int64 indices, answered by n int64 stamps.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import weakref
from collections.abc import Sequence

import numpy as np


def stamp_of(st: os.stat_result) -> int:
    """A number that changes when a file is written or replaced (its size, inode, device,
    modification and status-change times), never 0."""
    return hash((st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns)) or 1


def stamps(paths: Sequence[str]) -> np.ndarray:
    """:func:`stamp_of` of each path as int64, 0 where a file cannot be stat'ed."""

    def one(path: str) -> int:
        try:
            return stamp_of(os.stat(path))
        except OSError:
            return 0

    return np.fromiter(map(one, paths), np.int64, len(paths))


#: Runs this file as a script with no folder of easyfit's first on ``sys.path`` (its modules'
#: names must not shadow what numpy imports).
_RUN = "import runpy, sys; sys.path.pop(0); runpy.run_path(sys.argv[1], run_name='__main__')"


def _read(stream, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError
    return data


class StatChild:
    """A child process that stats ``paths[indices]`` on request (see the module's docstring);
    in this process where no child can be started."""

    def __init__(self, paths: Sequence[str]):
        self._paths = list(paths)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _RUN, __file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            table = "\0".join(self._paths).encode("utf-8", "surrogateescape")
            assert self._proc.stdin is not None
            self._proc.stdin.write(struct.pack("<Q", len(table)) + table)
            self._proc.stdin.flush()
        except OSError:
            self._proc = None
        weakref.finalize(self, _stop, self._proc)

    def stamps(self, indices: np.ndarray) -> np.ndarray:
        """The stamps of ``paths[indices]``, 0 where a file cannot be stat'ed."""
        indices = np.ascontiguousarray(indices, np.int64)
        with self._lock:
            proc = self._proc
            if proc is not None:
                try:
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(struct.pack("<Q", len(indices)) + indices.tobytes())
                    proc.stdin.flush()
                    return np.frombuffer(_read(proc.stdout, 8 * len(indices)), np.int64).copy()
                except (OSError, EOFError, ValueError):  # the child is gone: stat here
                    self._proc = None
        return stamps([self._paths[i] for i in indices.tolist()])

    def close(self) -> None:
        with self._lock:
            _stop(self._proc)
            self._proc = None


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        try:
            assert proc.stdin is not None
            proc.stdin.close()  # the child ends at end of input
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()


def _serve() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    (size,) = struct.unpack("<Q", _read(stdin, 8))
    paths = _read(stdin, size).decode("utf-8", "surrogateescape").split("\0")
    while True:
        try:
            (n,) = struct.unpack("<Q", _read(stdin, 8))
        except EOFError:
            return
        indices = np.frombuffer(_read(stdin, 8 * n), np.int64)
        stdout.write(stamps([paths[i] for i in indices.tolist()]).tobytes())
        stdout.flush()


if __name__ == "__main__":
    _serve()
