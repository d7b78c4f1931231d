"""What differs between two fingerprints of training data (``fingerprint_changes``), so that a
fit resuming from a backup taken on other data is refused (``ResumePoint.check_data``) instead
of going on from a position that means other samples. The fingerprint itself is a fact of the
data, worked out with the source contract (``easyfit.data.sources.base.data_fingerprint``, also
importable here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..data.sources.base import data_fingerprint

__all__ = ["data_fingerprint", "fingerprint_changes"]  # data_fingerprint: from easyfit.data.sources.base

#: The fingerprint's keys, as a message names them.
_WHAT = {
    "kind": "the kind of source",
    "samples": "the number of samples",
    "class_names": "the class names",
    "files": "the files (their names or sizes)",
    "arrays": "the arrays (their shapes, dtypes or values)",
    "subset": "the samples validation_split keeps",
    "records": "the records read from the files (their byte ranges, row groups or labels)",
}
#: Keys that backups written before they were fingerprinted lack: compared only when saved.
_LATER = {"records"}


def fingerprint_changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """What differs between two fingerprints, in words (the kind, the number of samples and the
    class names with their values, the hashes as changed), or None when nothing does.

    Example:
        >>> from easyfit.persistence.fingerprint import fingerprint_changes
        >>> fingerprint_changes({"kind": "Arrays", "samples": 10}, {"kind": "Arrays", "samples": 12})
        'the number of samples: 10 -> 12'
    """
    changed = [k for k in _WHAT if saved.get(k) != now.get(k) and (k in saved or k not in _LATER)]
    if not changed:
        return None
    shown = {"kind", "samples", "class_names"}  # the hashes say only that they changed
    said = [
        f"{_WHAT[k]}: {saved.get(k)} -> {now.get(k)}" if k in shown else f"{_WHAT[k]} changed"
        for k in changed
    ]
    return "; ".join(said)
