"""Several processes, one training run: a thin layer over JAX's own distributed runtime.

Every process runs the same script. ``initialize`` must come before anything touches a device;
after it, ``jax.devices()`` lists the devices of every process and the Trainer uses them all:
each process builds DALI pipelines for its own devices only, reads its devices' rows of every
global batch (the sample order is a function of seed and data pass, identical in every
process), and the jitted step reduces metrics across processes. Only process 0 prints progress.

Before JAX's runtime starts, the processes meet on the coordinator's port: if one never comes
within ``initialization_timeout``, every process that came raises a ``TimeoutError`` naming the
coordinator and the process ids that never arrived (JAX alone would abort the process from C++).
When a process dies later, the others stop with an error once they miss its heartbeats for
``heartbeat_timeout_seconds`` (30 s by default here, instead of JAX's 100 s): they never hang
forever.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from typing import Any

import jax

__all__ = ["initialize", "is_main_process"]

#: Seconds after which a silent process is declared dead and the others stop.
HEARTBEAT_TIMEOUT_S = 30
#: Seconds to wait for every process to join, by default.
INITIALIZATION_TIMEOUT_S = 300
#: Seconds a process waits past its deadline for the coordinator's verdict.
_GRACE_S = 5.0


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: int | Sequence[int] | None = None,
    heartbeat_timeout_seconds: int = HEARTBEAT_TIMEOUT_S,
    initialization_timeout: int = INITIALIZATION_TIMEOUT_S,
) -> None:
    """Joins this process to a multi-process run (``jax.distributed.initialize``).

    With no arguments, JAX detects the cluster (SLURM, Open MPI, Cloud TPU, ...). Elsewhere, give
    the coordinator (process 0's ``host:port``), the number of processes and this one's index.

    Args:
        coordinator_address: ``host:port`` of process 0.
        num_processes: how many processes take part.
        process_id: this process's index, 0 .. num_processes - 1.
        local_device_ids: GPUs this process uses (default: all it sees).
        heartbeat_timeout_seconds: a process silent this long is declared dead; the others
            then stop with an error.
        initialization_timeout: seconds to wait for every process to join; then a
            ``TimeoutError`` names the coordinator and the processes that never arrived.

    Raises:
        TimeoutError: a process (or the coordinator) did not come within
            ``initialization_timeout`` seconds.

    Example:
        >>> import easyfit as ef
        >>> ef.distributed.is_main_process()  # a single process is the main one
        True
    """
    if coordinator_address is not None and num_processes is not None and process_id is not None:
        _meet(coordinator_address, int(num_processes), int(process_id), initialization_timeout)
    kwargs: dict[str, Any] = {}
    if local_device_ids is not None:
        kwargs["local_device_ids"] = local_device_ids
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        heartbeat_timeout_seconds=heartbeat_timeout_seconds,
        initialization_timeout=initialization_timeout,
        **kwargs,
    )


def is_main_process() -> bool:
    """True in process 0, the one that prints and writes files."""
    return jax.process_index() == 0


def _meet(address: str, num_processes: int, process_id: int, timeout: float) -> None:
    """Waits until all ``num_processes`` processes have reached this point, meeting on the
    coordinator's port (then closed again, for JAX's coordination service to take).

    Raises:
        TimeoutError: naming ``address`` and the process ids that never arrived.
    """
    if num_processes < 2:
        return
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    if process_id == 0:
        _gather(int(port), num_processes, deadline, address, timeout)
    else:
        _join(host.strip("[]"), int(port), process_id, deadline, address, timeout)


def _gather(port: int, n: int, deadline: float, address: str, timeout: float) -> None:
    """Process 0: accepts the others' ids until all n are there or the deadline passes."""
    family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
    server = socket.create_server(("", port), family=family, dualstack_ipv6=family == socket.AF_INET6)
    peers: dict[int, socket.socket] = {}
    try:
        while len(peers) < n - 1 and (left := deadline - time.monotonic()) > 0:
            server.settimeout(left)
            try:
                conn, _ = server.accept()
                conn.settimeout(max(deadline - time.monotonic(), 0.1))
                peers[int(conn.recv(64).decode().strip())] = conn
            except (TimeoutError, OSError, ValueError):
                continue
        missing = sorted(set(range(1, n)) - set(peers))
        message = (
            f"{address}: process(es) {missing} of {n} never arrived within {timeout:g} s "
            "(initialization_timeout)"
        )
        reply = (f"missing {message}" if missing else "go").encode()
        for conn in peers.values():
            try:
                conn.sendall(reply + b"\n")
                conn.recv(8)  # the peer closes first: the port is left free of TIME_WAIT
            except OSError:
                pass
    finally:
        for conn in peers.values():
            conn.close()
        server.close()
    if missing:
        raise TimeoutError(message)


def _join(host: str, port: int, process_id: int, deadline: float, address: str, timeout: float) -> None:
    """Process > 0: tells the coordinator its id and waits for everyone to be there."""
    reply = b""
    while not reply and (left := deadline - time.monotonic()) > 0:
        try:
            with socket.create_connection((host, port), timeout=min(left, 5.0)) as conn:
                conn.sendall(f"{process_id}\n".encode())
                # the coordinator's verdict comes at its own deadline: a little after ours
                conn.settimeout(max(deadline - time.monotonic(), 0.0) + _GRACE_S)
                reply = conn.recv(4096).strip()
        except OSError:
            time.sleep(0.2)
    if reply == b"go":
        return
    if reply.startswith(b"missing "):
        raise TimeoutError(reply.decode()[len("missing ") :])
    raise TimeoutError(
        f"{address}: the coordinator (process 0) did not answer within {timeout:g} s (initialization_timeout)"
    )
