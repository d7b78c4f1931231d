"""A process that never joins a multi-process run: a Python TimeoutError within the user's
``initialization_timeout`` in every process that came, naming the coordinator and the missing
process ids (JAX alone waits 5 minutes, then aborts the process from C++)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

import easyfit as ef

JOIN = """
import sys, easyfit as ef
try:
    ef.distributed.initialize(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                              initialization_timeout=float(sys.argv[4]))
except TimeoutError as e:
    print("TimeoutError:", e)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(address: str, n: int, pid: int, timeout: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", JOIN, address, str(n), str(pid), str(timeout)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_every_process_that_came_names_the_missing_one():
    address = f"localhost:{_port()}"
    start = time.monotonic()
    procs = [_start(address, 3, pid, 4) for pid in (0, 1)]  # process 2 never comes
    outs = [p.communicate(timeout=60) for p in procs]
    assert time.monotonic() - start < 30  # not JAX's 5 minutes
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err[-2000:]  # a Python error, no C++ abort
        assert f"TimeoutError: {address}: process(es) [2] of 3 never arrived within 4 s" in out, out


def test_the_coordinator_alone_names_every_missing_process():
    address = f"127.0.0.1:{_port()}"
    with pytest.raises(TimeoutError, match=r"127\.0\.0\.1:\d+: process\(es\) \[1, 2, 3\] of 4 never"):
        ef.distributed.initialize(address, 4, 0, initialization_timeout=1)


def test_a_process_without_its_coordinator_says_so():
    address = f"127.0.0.1:{_port()}"
    with pytest.raises(TimeoutError, match="the coordinator \\(process 0\\) did not answer "
                                           "within 1.5 s"):
        ef.distributed.initialize(address, 2, 1, initialization_timeout=1.5)
