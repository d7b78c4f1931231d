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

Processes that are alive but disagree would hang too: given another batch size or other data,
they reach different collectives and wait for each other for ever. So ``fit`` first has them
agree on its plan (:func:`agree_on_fit`) through the coordinator's key-value store, before its
first collective: a difference is a ``ValueError`` in every process naming what differs, its
values and the process, and a process that does not come within ``agreement_timeout`` a
``TimeoutError`` naming it. A single process skips all of it.
"""

from __future__ import annotations

import itertools
import json
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

__all__ = ["agree", "agree_on_fit", "agree_on_pass", "initialize", "is_main_process"]

#: Seconds after which a silent process is declared dead and the others stop.
HEARTBEAT_TIMEOUT_S = 30
#: Seconds to wait for every process to join, by default.
INITIALIZATION_TIMEOUT_S = 300
#: Seconds a process waits at an agreement (fit's start) for the others, by default.
AGREEMENT_TIMEOUT_S = 300
#: Seconds a process waits past its deadline for the coordinator's verdict.
_GRACE_S = 5.0
#: The agreement timeout this process was initialized with.
_agreement_timeout: float = AGREEMENT_TIMEOUT_S
#: Numbers the agreements of a run: every process makes the same ones in the same order.
_agreements = itertools.count()
#: Characters of a value a disagreement shows (long class-name lists are cut).
_SHOWN = 80


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: int | Sequence[int] | None = None,
    heartbeat_timeout_seconds: int = HEARTBEAT_TIMEOUT_S,
    initialization_timeout: int = INITIALIZATION_TIMEOUT_S,
    agreement_timeout: float = AGREEMENT_TIMEOUT_S,
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
        agreement_timeout: seconds each ``fit`` waits at its start for every process to tell
            its plan (:func:`agree_on_fit`): time for the slowest to list its data.

    Raises:
        TimeoutError: a process (or the coordinator) did not come within
            ``initialization_timeout`` seconds.

    Example:
        >>> import easyfit as ef
        >>> ef.distributed.is_main_process()  # a single process is the main one
        True
    """
    global _agreement_timeout
    _agreement_timeout = float(agreement_timeout)
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


def agree(what: str, values: Callable[[], Mapping[str, Any]], *, timeout: float | None = None) -> None:
    """Checks that every process has the same ``values`` at ``what``, a point every process
    reaches in the same order (fit's start), before a collective that would hang on a
    difference. In a single process it does nothing (``values`` is not even called).

    Each process puts its values (JSON) in the coordinator's key-value store, under a key
    numbered by the agreements so far, and reads every other's; all compare them with
    process 0's, so all reach the same verdict.

    Args:
        what: the point, as messages name it (``"fit"``).
        values: makes this process's values: plain, JSON-like values (other objects compare
            as their ``str``), in nested dicts compared key by key.
        timeout: seconds to wait for the others (default: ``initialize``'s
            ``agreement_timeout``).

    Raises:
        ValueError: a value differs, naming it, its values and the processes, e.g. "process 1
            has batch_size=16, process 0 has 32".
        TimeoutError: naming the processes that did not reach ``what`` within ``timeout``.

    Example:
        >>> import easyfit as ef
        >>> ef.distributed.agree("fit", lambda: {"batch_size": 32})  # one process: nothing to do
    """
    state = _runtime()
    if state is None:
        return
    limit = _agreement_timeout if timeout is None else float(timeout)
    n, me = int(state.num_processes), int(state.process_id)
    key = f"easyfit/agree/{next(_agreements)}/{what}"
    mine = json.dumps(values(), sort_keys=True, default=str)
    state.client.key_value_set(f"{key}/{me}", mine)
    seen: dict[int, Any] = {me: json.loads(mine)}
    missing = []
    deadline = time.monotonic() + limit
    for other in range(n):
        if other == me:
            continue
        wait_ms = max(int((deadline - time.monotonic()) * 1000), 1)
        try:
            seen[other] = json.loads(state.client.blocking_key_value_get(f"{key}/{other}", wait_ms))
        except RuntimeError as e:  # jax.errors.JaxRuntimeError
            if "DEADLINE_EXCEEDED" not in str(e):
                raise
            missing.append(other)
    said = [
        f"process {p} has {name}={_shown(theirs)}, process {ref} has {_shown(ours)}"
        for ref in [min(seen)]
        for p in sorted(seen)
        if p != ref
        for name, theirs, ours in _differences(seen[p], seen[ref])
    ]
    absent = f"process(es) {missing} of {n} did not reach {what} within {limit:g} s (agreement_timeout)"
    if said:
        raise ValueError(
            f"the processes differ at {what} (every process must be given the same data and "
            f"arguments): {'; '.join(said)}" + (f"; and {absent}" if missing else "")
        )
    if missing:
        raise TimeoutError(f"{absent}: did it fail before, or run other steps?")


def agree_on_fit(data: Any, validation_data: Any = None, **settings: Any) -> None:
    """``fit``'s plan, the same in every process (:func:`agree`) before its first collective:
    its ``settings`` (batch size, epochs, steps per epoch, seed, the model's input spec, ...),
    and the fingerprint of the training and validation data (kind, number of samples, class
    names, a hash of the files' names and sizes or of the arrays) with the sample spec the
    training data declares. ``data``: fit's ``TrainingData`` (whose fingerprints are worked
    out once, for this and a backup alike), or a training source beside ``validation_data``.
    Nothing is computed in a single process."""

    def plan() -> dict[str, Any]:
        from .data.resolve import TrainingData
        from .data.sources.base import data_fingerprint

        if isinstance(data, TrainingData):
            return {**settings, **data.agreed()}
        val = None if validation_data is None else data_fingerprint(validation_data)
        train = {**data_fingerprint(data), "sample_spec": data.output_spec()}
        return {**settings, "data": train, "validation_data": val}

    agree("fit", plan)


def agree_on_pass(what: str, data: Any, **settings: Any) -> None:
    """``evaluate``'s or ``predict``'s plan, the same in every process (:func:`agree`) before
    its first collective: its ``settings`` (batch size, steps) and the data's fingerprint.
    Nothing is computed in a single process."""

    def plan() -> dict[str, Any]:
        from .data.sources.base import data_fingerprint

        return {**settings, "data": data_fingerprint(data)}

    agree(what, plan)


def _runtime() -> Any:
    """JAX's distributed state when this process is one of several (its client's key-value
    store is there in JAX 0.10 and 0.11), else None."""
    from jax._src import distributed

    state = getattr(distributed, "global_state", None)
    if state is None or getattr(state, "client", None) is None or int(state.num_processes) < 2:
        return None
    return state


def _differences(theirs: Any, ours: Any, name: str = "") -> list[tuple[str, Any, Any]]:
    """``(name, theirs, ours)`` for each value that differs, dicts compared key by key."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        return [
            found
            for key in sorted(set(theirs) | set(ours))
            for found in _differences(theirs.get(key), ours.get(key), f"{name}.{key}" if name else key)
        ]
    return [] if theirs == ours else [(name, theirs, ours)]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


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
