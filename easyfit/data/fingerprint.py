"""The fingerprint of a training source: what identifies the data, cheaply (no file is read),
so that a fit resuming from a backup taken on other data is refused, and several processes
check that they read the same data. A fact of the data, worked out in the data layer
(``TrainingData.fingerprint``); persistence records and compares it."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import jax
import numpy as np

from .sources.base import FileBacked, InMemory, RecordsLayout, View
from .storage import storage_of

__all__ = ["data_fingerprint"]

#: Rows of an array source hashed for its fingerprint (evenly spaced; never the whole array).
_SAMPLED_ROWS = 64


def _hash(*parts: Any) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part if isinstance(part, bytes) else repr(part).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def data_fingerprint(source: Any) -> dict[str, Any]:
    """What identifies a training source, cheaply (no file is read): its kind, the number of
    samples, the class names, and a hash of its files' paths (relative to the folder they
    share) and sizes (and for record files, what their index read: each record's byte range or
    row group and label, in memory already), or for arrays of their shapes, dtypes and a few
    evenly spaced rows; a ``Subset`` (``validation_split``) adds the indices it keeps. A file
    rewritten with the same size, records and labels (only its images' bytes changed) is not
    told apart: that takes reading it. Recorded in backups, compared
    when a fit resumes (``ResumePoint.check_data``)."""
    base, indices = source, None
    while isinstance(base, View):  # a Subset of a source
        indices = np.asarray(base.indices) if indices is None else np.asarray(base.indices)[indices]
        base = base.source
    found: dict[str, Any] = {
        "kind": type(base).__name__,
        "samples": int(len(source)),
        "class_names": list(source.class_names) if source.class_names is not None else None,
    }
    files = base.files if isinstance(base, FileBacked) else None
    if isinstance(files, (list, tuple)) and files and all(isinstance(f, str) for f in files):
        storage = storage_of(files)  # in a bucket: sizes from its listing
        paths = [storage.absolute(f) for f in files]
        top = os.path.commonpath(paths)  # the folder above them, or the one file's
        top = top if len(set(paths)) > 1 else os.path.dirname(top)
        size = storage.size
        found["files"] = _hash(*((os.path.relpath(p, top), size(f)) for p, f in zip(paths, files)))
        if isinstance(base, RecordsLayout):  # record files: a rewrite of the same size moves records
            found["records"] = _hash(*(np.ascontiguousarray(a).tobytes() for a in base.records_layout()))
    elif isinstance(base, InMemory):
        leaves = jax.tree_util.tree_leaves((base.x, base.y))
        rows: list[Any] = [
            np.unique(np.linspace(0, len(a) - 1, _SAMPLED_ROWS).astype(np.int64)) if len(a) else []
            for a in leaves
        ]
        found["arrays"] = _hash(
            *((a.shape, a.dtype.str) for a in leaves),
            *(np.ascontiguousarray(np.asarray(a)[r]).tobytes() for a, r in zip(leaves, rows, strict=False)),
        )
    if indices is not None:
        found["subset"] = _hash(np.ascontiguousarray(indices, dtype=np.int64).tobytes())
    return found
