"""Reads every record of a Caffe2 LMDB once, in a child process, before DALI touches it.

DALI's ``fn.readers.caffe2`` and a hand-written parser of ``data.mdb`` crash the process
(SIGSEGV on a smashed page, SIGBUS on a truncated file); the ``lmdb`` package detects most
damage (``lmdb.CorruptedError``, ``lmdb.InvalidError``) but itself dies with SIGBUS on a
truncated file. So the walk checks the file's size against its meta pages, then reads every
key and value with ``lmdb`` and parses each value as Caffe2 ``TensorProtos``, in a child
process: whatever happens, the parent survives and names the record. The child writes the
index of the record it is reading into a shared 8-byte file, so a crash still names it.

Run by path (``python lmdb_walk.py DB PROGRESS``), so the child imports neither easyfit nor
JAX: it prints one JSON line, ``{"num": n}`` or ``{"record": k, "problem": "..."}``.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import struct
import sys
from typing import Any

_META = struct.Struct("<I I Q Q 96s Q Q")  # magic, version, address, mapsize, dbs, last_pg, txnid
_MAGIC = 0xBEEFC0DE


def size_problem(path: str) -> str | None:
    """Why ``data.mdb``'s size cannot hold the pages its newest meta page names, or None."""
    data = os.path.join(path, "data.mdb")
    size = os.path.getsize(data)
    with open(data, "rb") as f:
        first = f.read(16 + _META.size)
        if len(first) < 16 + _META.size:
            return f"data.mdb is truncated ({size} bytes)"
        magic, *_ = _META.unpack_from(first, 16)
        if magic != _MAGIC:
            return "data.mdb is not an LMDB file (bad meta page)"
        psize = struct.unpack_from("<I", first, 16 + 24)[0]  # the free DB's md_pad: page size
        if psize < 512 or psize & (psize - 1):
            return f"data.mdb has a damaged meta page (page size {psize})"
        f.seek(psize)
        second = f.read(16 + _META.size)
    metas = [_META.unpack_from(first, 16)]
    if len(second) == 16 + _META.size and _META.unpack_from(second, 16)[0] == _MAGIC:
        metas.append(_META.unpack_from(second, 16))
    last_pg = max(metas, key=lambda m: m[6])[5]
    need = (last_pg + 1) * psize
    if size < need:
        return f"data.mdb is truncated ({size} of {need} bytes)"
    return None


def _tensor_protos() -> Any:
    spec = importlib.util.spec_from_file_location(
        "_easyfit_protos", os.path.join(os.path.dirname(__file__), os.pardir, "protos.py")
    )
    assert spec is not None and spec.loader is not None
    protos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(protos)
    return protos.caffe2_messages()["TensorProtos"]


def walk(path: str, progress: str) -> dict:
    """``{"num": n}``, or where and what the first problem is."""
    import lmdb
    from google.protobuf.message import DecodeError

    problem = size_problem(path)
    if problem:
        return {"record": None, "problem": problem}
    messages = _tensor_protos()
    with open(progress, "r+b") as f:
        where = mmap.mmap(f.fileno(), 8)
    k = 0
    try:
        env = lmdb.open(path, readonly=True, lock=False, subdir=True)
        with env.begin(buffers=True) as txn:
            cursor = txn.cursor()
            more = cursor.first()
            while more:
                where[:8] = struct.pack("<q", k)
                value = bytes(cursor.value())
                try:
                    protos = messages.FromString(value).protos
                except DecodeError:
                    protos = None
                if protos is None or len(protos) < 2:
                    return {
                        "record": k,
                        "problem": "not a Caffe2 TensorProtos of an image and a label (unparsable record)",
                    }
                k += 1
                more = cursor.next()
        env.close()
    except lmdb.Error as e:
        return {"record": k, "problem": f"damaged LMDB ({type(e).__name__}: {e})"}
    return {"num": k}


if __name__ == "__main__":
    print(json.dumps(walk(sys.argv[1], sys.argv[2])), flush=True)
