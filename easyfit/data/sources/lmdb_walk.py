"""Reads and checks every record of a Caffe2 LMDB once, in child processes, before DALI touches it.

DALI's ``fn.readers.caffe2`` and a hand-written parser of ``data.mdb`` crash the process
(SIGSEGV on a smashed page, SIGBUS on a truncated file); the ``lmdb`` package detects most
damage (``lmdb.CorruptedError``, ``lmdb.InvalidError``) but itself dies with SIGBUS on a
truncated file. So the walk checks the file's size against its meta pages, then reads every
key and value with ``lmdb``, parses each value as Caffe2 ``TensorProtos`` and, when the
records hold encoded images (record 0 does), checks each image as other sources' files are
checked (:mod:`easyfit.data.validation`), in child processes: whatever happens, the parent
survives and names the record. Each child writes the index of the record it is reading into
its own 8 bytes of a shared file, so a crash still names it.

:func:`walk_lmdb` splits the records into contiguous ranges of key order, one per child (one
per available core, fewer for a small ``data.mdb``): each child counts keys up to its range
without reading their values, then reads and checks its range. The parent takes the children's
answers in key order, so the problem it names is the first one in key order, as a walk in one
process would find it.

A child runs this file by path (``python lmdb_walk.py DB PROGRESS PART PARTS MAX_PIXELS
LABELS``) and imports neither easyfit's package nor JAX (only the modules of
``easyfit/data`` it needs, under a private package name): it prints one JSON line,
``{"num": n, "single": bool}`` (the records up to the end of its range, whether each held one
label, written to LABELS as float64) or ``{"record": k, "problem": "..."}``.
"""

from __future__ import annotations

import array
import importlib
import json
import mmap
import os
import struct
import sys
import types
from typing import Any

_META = struct.Struct("<I I Q Q 96s Q Q")  # magic, version, address, mapsize, dbs, last_pg, txnid
_MAGIC = 0xBEEFC0DE
#: Bytes of ``data.mdb`` per child at least: starting a child (a fresh interpreter) costs more
#: than checking a smaller share.
PART_BYTES = 4 << 20
_UNPARSABLE = "not a Caffe2 TensorProtos of an image and a label (unparsable record)"


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


def _data_modules() -> tuple[Any, Any]:
    """``easyfit.data``'s ``validation.encoded`` and ``protos`` modules, loaded in a child under
    the private package name ``_easyfit`` without running easyfit's ``__init__`` (which imports
    JAX)."""
    data = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name, folder in (("_easyfit", os.path.dirname(data)), ("_easyfit.data", data)):
        package = types.ModuleType(name)
        package.__path__ = [folder]
        sys.modules.setdefault(name, package)
    return (
        importlib.import_module("_easyfit.data.validation.encoded"),
        importlib.import_module("_easyfit.data.protos"),
    )


def _parse(messages: Any, value: bytes) -> tuple[Any, Any] | None:
    """The image and label tensors of a record, or None when it does not parse as such."""
    from google.protobuf.message import DecodeError

    try:
        protos = messages.FromString(value).protos
    except DecodeError:
        return None
    return (protos[0], protos[1]) if len(protos) >= 2 else None


def walk(path: str, progress: str, part: int, parts: int, max_pixels: int | None, labels_out: str) -> dict:
    """Checks the records of range ``part`` of ``parts`` (the last reaches the end), with
    ``MAX_IMAGE_PIXELS = max_pixels``: ``{"num": n, "single": bool}`` with the labels written
    to ``labels_out``, or where and what the first problem is."""
    import lmdb

    problem = size_problem(path)
    if problem:
        return {"record": None, "problem": problem}
    checks, protos = _data_modules()
    checks.MAX_IMAGE_PIXELS = max_pixels
    messages = protos.caffe2_messages()["TensorProtos"]
    with open(progress, "r+b") as f:
        where = mmap.mmap(f.fileno(), 8 * parts)
    slot = 8 * part
    labels = array.array("d")
    single, encoded, k = True, False, 0
    try:
        env = lmdb.open(path, readonly=True, lock=False, subdir=True)
        with env.begin(buffers=True) as txn:
            entries = env.stat()["entries"]
            start = part * entries // parts
            stop = (part + 1) * entries // parts if part < parts - 1 else -1
            cursor = txn.cursor()
            more = cursor.first()
            while more and k != stop:
                where[slot : slot + 8] = struct.pack("<q", k)
                if k >= start or k == 0:  # record 0 says whether the images are encoded
                    record = _parse(messages, bytes(cursor.value()))
                    if record is None:
                        return {"record": k, "problem": _UNPARSABLE}
                    image, label = record
                    if k == 0:
                        encoded = bool(image.string_data)
                if k >= start:
                    if encoded:
                        problem = checks.image_problem(
                            image.string_data[0] if image.string_data else image.byte_data
                        )
                        if problem:
                            return {"record": k, "problem": problem}
                    value = label.int32_data or label.float_data
                    single = single and len(value) == 1
                    if single:
                        labels.append(value[0])
                k += 1
                more = cursor.next()
        env.close()
    except lmdb.Error as e:
        return {"record": k, "problem": f"damaged LMDB ({type(e).__name__}: {e})"}
    with open(labels_out, "wb") as f:
        labels.tofile(f)
    return {"num": k, "single": single}


def _parts(path: str) -> int:
    """Children for ``path``: one per :data:`PART_BYTES` of ``data.mdb``, at most one per
    available core."""
    from ..._env import available_cores  # in the parent only: a child imports no easyfit package

    return max(1, min(available_cores(), os.path.getsize(os.path.join(path, "data.mdb")) // PART_BYTES))


def walk_lmdb(path: str, parts: int | None = None) -> tuple[int, Any]:
    """Reads and checks every record of the Caffe2 LMDB ``path`` in ``parts`` child processes
    (default: by the size of ``data.mdb`` and the available cores).

    Returns:
        The number of records, and every label in key order (float64; None unless each
        record holds one).

    Raises:
        DataError: naming the LMDB and the first record in key order that is damaged, does not
            parse, or holds a broken image (``<path>: record k (in key order): <what>``), even
            when reading it crashes the child; or the LMDB holds no records.
    """
    import signal
    import subprocess
    import tempfile

    import numpy as np

    from ...errors import DataError
    from ..validation import encoded

    parts = parts or _parts(path)
    pixels = encoded.MAX_IMAGE_PIXELS
    with tempfile.TemporaryDirectory(prefix="easyfit-lmdb-") as tmp:
        progress = os.path.join(tmp, "progress")
        with open(progress, "wb") as f:
            f.write(struct.pack("<q", -1) * parts)
        children = [
            subprocess.Popen(
                [sys.executable, __file__, path, progress, str(w), str(parts), str(pixels), f"{tmp}/{w}"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for w in range(parts)
        ]
        try:
            found = []
            for w, child in enumerate(children):  # in key order: the first problem wins
                out, _ = child.communicate()
                if child.returncode != 0:
                    how = (
                        signal.Signals(-child.returncode).name
                        if child.returncode < 0
                        else f"exit status {child.returncode}"
                    )
                    with open(progress, "rb") as f:
                        reached = struct.unpack_from("<q", f.read(), 8 * w)[0]
                    where = f"record {reached} (in key order)" if reached >= 0 else "its meta pages"
                    raise DataError(f"{path}: damaged LMDB: reading {where} crashed the reader ({how})")
                answer = json.loads(out)
                if "num" not in answer:
                    where = "" if answer["record"] is None else f" record {answer['record']} (in key order):"
                    raise DataError(f"{path}:{where} {answer['problem']}")
                found.append(answer)
            labels = [np.fromfile(f"{tmp}/{w}", np.float64) for w in range(parts)]
        finally:
            for child in children:  # those after a problem: their answers are not needed
                if child.poll() is None:
                    child.kill()
                    child.communicate()
    num = found[-1]["num"]
    if num == 0:
        raise DataError(f"{path}: the LMDB holds no records")
    return num, np.concatenate(labels) if all(a["single"] for a in found) else None


if __name__ == "__main__":
    db, where, part, parts, pixels, labels_out = sys.argv[1:7]
    limit = None if pixels == "None" else int(pixels)
    print(json.dumps(walk(db, where, int(part), int(parts), limit, labels_out)), flush=True)
