"""Reads back an offline W&B run: the records of its ``run-<id>.wandb`` file.

wandb (0.2x on) has no Python reader for these files any more (``wandb sync`` replays them to a
server, which a test has not). The file is a LevelDB log (32 KiB blocks of records, each with a
7-byte header: CRC, length, kind; a record may span blocks as FIRST, MIDDLE..., LAST) after a
7-byte W&B header, and each record is W&B's own protobuf ``wandb.proto.wandb_internal_pb2.Record``,
parsed here by wandb's classes.
"""

from __future__ import annotations

import glob
import json
import struct
from pathlib import Path
from typing import Any

_BLOCK = 32 * 1024
_HEADER = struct.Struct("<IHB")  # crc32c, length, kind
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: str | Path) -> list[Any]:
    """Every record of the ``.wandb`` file at ``path``, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    out, pending, pos = [], b"", 7
    while pos + _HEADER.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER.size:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = _HEADER.unpack_from(data, pos)
        if kind == 0:  # zero fill: the end
            break
        chunk = data[pos + _HEADER.size : pos + _HEADER.size + length]
        pos += _HEADER.size + length
        if kind == _FULL:
            out.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            out.append(pending + chunk)
    parsed = []
    for raw in out:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        parsed.append(record)
    return parsed


def offline_run(wandb_dir: str | Path) -> dict[str, Any]:
    """The one offline run under ``wandb_dir``: its ``run_id``, ``config`` (dict), ``history`` (one dict
    per logged row), ``summary`` (the last value of each key), ``artifacts`` (``(name, type,
    [file paths])``) and ``exit_code``."""
    (path,) = glob.glob(str(Path(wandb_dir) / "wandb" / "offline-run-*" / "run-*.wandb"))
    run: dict[str, Any] = {"config": {}, "history": [], "summary": {}, "artifacts": [], "exit_code": None}

    def key(item: Any) -> str:
        return "/".join(item.nested_key) if item.nested_key else item.key

    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):
            if kind == "run":
                run["run_id"] = record.run.run_id
            updates = record.run.config.update if kind == "run" else record.config.update
            run["config"].update({key(u): json.loads(u.value_json) for u in updates})
        elif kind == "history":
            run["history"].append({key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            run["summary"].update({key(u): json.loads(u.value_json) for u in record.summary.update})
        elif kind == "artifact":
            files = [entry.path for entry in record.artifact.manifest.contents]
            run["artifacts"].append((record.artifact.name, record.artifact.type, files))
        elif kind == "exit":
            run["exit_code"] = record.exit.exit_code
    return run
