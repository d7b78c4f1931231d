"""MXNet RecordIO (``.rec`` + ``.idx``, as written by im2rec), index-driven."""

from __future__ import annotations

import os
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import DataError
from ..images import ImageOptions, ImageSettings
from .base import int32_labels
from .records import RecordFiles, list_files
from .registry import Format, holding, register

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["RecordIO"]

MAGIC = 0xCED7230A
_FRAME = struct.Struct("<II")  # magic, (continue flag << 29) | length
_HEADER = struct.Struct("<IfQQ")  # IRHeader: flag, label, id, id2


def _index_file(rec: str) -> str | None:
    for idx in (os.path.splitext(rec)[0] + ".idx", rec + ".idx"):
        if os.path.isfile(idx):
            return idx
    return None


def _read_index(idx: str, size: int) -> np.ndarray:
    """Record offsets from an ``.idx`` file (``key<TAB>offset`` lines), in file order."""
    try:
        with open(idx) as f:
            listed = [int(line.split()[1]) for line in f if line.strip()]
    except (OSError, ValueError, IndexError) as e:
        raise DataError(f"{idx}: not a RecordIO index (key<TAB>offset lines): {e}") from None
    offsets = np.unique(np.asarray(listed, np.int64))
    if len(offsets) and (offsets[0] < 0 or offsets[-1] >= size):
        raise DataError(f"{idx}: offsets beyond the end of its .rec file ({size} bytes)")
    return offsets


def _walk(
    fd: int, rec: str, size: int, offsets: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, list[tuple[Any, ...]]]:
    """``(offsets, lengths, labels)`` of the records, reading their frame and IRHeader."""
    starts: list[int] = []
    lengths: list[int] = []
    labels: list[tuple[Any, ...]] = []
    pos = 0
    todo = iter(offsets) if offsets is not None else None
    while True:
        if todo is not None:
            listed = next(todo, None)
            if listed is None:
                break
            pos = int(listed)
        elif pos >= size:
            break
        start = pos
        head = os.pread(fd, _FRAME.size + _HEADER.size, pos)
        label = None
        while True:  # a record split in parts: walk them to the last one
            if len(head) < _FRAME.size:
                raise DataError(f"{rec}: truncated record at byte offset {pos}")
            magic, word = _FRAME.unpack_from(head)
            if magic != MAGIC:
                raise DataError(
                    f"{rec}: not a RecordIO record at byte offset {pos} "
                    f"(magic {magic:#x}, expected {MAGIC:#x})"
                )
            flag, length = word >> 29, word & ((1 << 29) - 1)
            if label is None:
                if length < _HEADER.size or len(head) < _FRAME.size + _HEADER.size:
                    raise DataError(f"{rec}: record at byte offset {pos} is too short")
                label = _HEADER.unpack_from(head, _FRAME.size)
            pos += _FRAME.size + length + (-length % 4)
            if flag in (0, 3):
                break
            head = os.pread(fd, _FRAME.size, pos)
        if pos > size:
            raise DataError(f"{rec}: truncated record at byte offset {start}")
        if offsets is not None and len(starts) + 1 < len(offsets) and pos > offsets[len(starts) + 1]:
            raise DataError(
                f"{rec}: the record at byte offset {start} runs past the next one "
                f"(at {int(offsets[len(starts) + 1])}): damaged length"
            )
        starts.append(start)
        lengths.append(pos - start)
        labels.append(label)
    return (np.asarray(starts, np.int64), np.asarray(lengths, np.int64), labels)


class RecordIO(RecordFiles):
    """Images in MXNet RecordIO files: ``.rec`` (+ its ``.idx``, as written by ``im2rec``).

    Each record is MXNet's ``IRHeader`` (flag, label, id, id2) followed by an encoded image;
    DALI decodes the images. The ``.idx`` file gives the records' offsets; without one, the
    ``.rec`` file's record headers are walked once (in memory: nothing is written). The labels
    (the header's float label; integral labels become class indices) are read when the source
    is built::

        root/
          train.rec     # one or more .rec files, read in name order
          train.idx     # optional: "key<TAB>offset" lines

    Records are addressed one by one, so this source is index-driven (same batches whatever
    the number of devices; ``validation_split`` works).

    Args:
        path: a ``.rec`` file or a directory of them.
        **settings: the image settings, :class:`~easyfit.data.ImageFolder`'s keyword arguments
            (``image_size``, ``augment``, ``normalize``, ...: ``easyfit.data.images.ImageOptions``).

    Example:
        >>> import easyfit as ef
        >>> train = ef.data.RecordIO(MNIST_FORMATS["recordio"] + "/train")
        >>> len(train), train.image_shape, train.label_dtype
        (200, (28, 28, 1), dtype('int32'))
    """

    def __init__(
        self,
        path: str | os.PathLike,
        **settings: Unpack[ImageOptions],
    ):
        root = os.fspath(path)
        self.files = list_files(root, (".rec",), "RecordIO")
        self._stamp_files("record offsets and labels")
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        headers: list[tuple[Any, ...]] = []
        for k, rec in enumerate(self.files):
            size = os.path.getsize(rec)
            idx = _index_file(rec)
            offsets = _read_index(idx, size) if idx else None
            try:
                fd = os.open(rec, os.O_RDONLY)
            except OSError as e:
                raise DataError(f"{rec}: cannot be read ({e.strerror or e})") from None
            try:
                starts, lengths, hdrs = _walk(fd, rec, size, offsets)
            finally:
                os.close(fd)
            parts.append((np.full(len(starts), k, np.int32), starts, lengths))
            headers += hdrs
        self._set_ranges(parts)
        if any(h[0] != 0 for h in headers):
            raise DataError(
                f"{root}: records with several labels (IRHeader flag > 0) are not "
                "supported; easyfit reads one label per image"
            )
        labels = np.asarray([h[1] for h in headers], np.float32)
        if len(labels) and np.array_equal(labels, np.round(labels)):
            labels = int32_labels(labels, self.locate)
        RecordFiles.__init__(self, root, labels, ImageSettings.of("RecordIO", settings))

    def parse(self, index: int, raw: bytes) -> tuple[bytes, Any]:
        payload, pos = [], 0
        while pos < len(raw):
            _, word = _FRAME.unpack_from(raw, pos)
            flag, length = word >> 29, word & ((1 << 29) - 1)
            payload.append(raw[pos + _FRAME.size : pos + _FRAME.size + length])
            pos += _FRAME.size + length + (-length % 4)
            if flag in (0, 3):
                break
        data = struct.pack("<I", MAGIC).join(payload)  # parts were split at the magic number
        return data[_HEADER.size :], None

    def describe(self) -> str:
        return f"RecordIO({self.root!r}: {self.num_samples} records)"


register(Format("recordio", RecordIO, holding(".rec"), suffixes=(".rec",)))
