"""TFRecord files of ``tf.train.Example`` (with DALI's index files), index-driven."""

from __future__ import annotations

import io
import os
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import DataError
from ..images import ImageOptions, ImageSettings
from ..protos import tf_example
from ..storage import storage_for
from .records import RecordFiles, list_files
from .registry import Format, holding, register

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["TFRECORD_SUFFIXES", "TFRecord"]

TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec")
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_FRAMING = 8 + 4 + 4  # length, its CRC, the data's CRC


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of ``data`` (``google-crc32c``, Google's implementation).

    Example:
        >>> from easyfit.data.sources.tfrecord import masked_crc
        >>> hex(masked_crc(b""))
        '0xa282ead8'
    """
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def crc_problem(raw: bytes) -> str | None:
    """What is wrong with a framed record's length, length CRC or data CRC, or None."""
    n = _LENGTH.unpack_from(raw)[0]
    if _CRC.unpack_from(raw, 8)[0] != masked_crc(raw[:8]):
        return "the CRC of its length field does not match (damaged record)"
    if len(raw) != _FRAMING + n:
        return f"its length field says {n} bytes, its index {len(raw) - _FRAMING}"
    if _CRC.unpack_from(raw, 12 + n)[0] != masked_crc(raw[12 : 12 + n]):
        return "the CRC-32C of its data does not match (damaged record)"
    return None


def index_file(path: str) -> str | None:
    """The index of a TFRecord file, as DALI's ``tfrecord2idx`` names it (``<file>.idx``)."""
    for idx in (path + ".idx", os.path.splitext(path)[0] + ".idx"):
        if storage_for(idx).isfile(idx):
            return idx
    return None


def _read_index(idx: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and lengths from index ``idx`` of a TFRecord file of ``size`` bytes, every row
    checked to lie inside the file (a negative offset or a huge length would reach ``pread``)."""
    fix = "; remake it with DALI's tfrecord2idx, or remove it (easyfit then walks the file)"
    try:
        text = io.BytesIO(storage_for(idx).read(idx))
        rows = np.loadtxt(text, dtype=np.int64, ndmin=2)
    except (OSError, ValueError, OverflowError) as e:
        raise DataError(f"{idx}: not a TFRecord index (offset size lines): {e}{fix}") from None
    if rows.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if rows.shape[1] != 2:
        raise DataError(f"{idx}: not a TFRecord index (offset size lines){fix}")
    offsets, lengths = rows[:, 0], rows[:, 1]
    bad = np.flatnonzero((offsets < 0) | (lengths < _FRAMING) | (lengths > size - offsets))
    if len(bad):
        i = int(bad[0])
        raise DataError(
            f"{idx}: line {i + 1} (record {i}: offset {offsets[i]}, size {lengths[i]}) does not "
            f"lie inside its TFRecord file ({size} bytes){fix}"
        )
    return offsets, lengths


def _walk(path: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and lengths of the records, from their length fields (nothing is written)."""
    offsets, lengths, pos = [], [], 0
    with storage_for(path).open(path) as f:
        while pos < size:
            f.seek(pos)
            head = f.read(8)
            if len(head) < 8:
                raise DataError(f"{path}: truncated record at byte offset {pos}")
            n = _FRAMING + _LENGTH.unpack(head)[0]
            if pos + n > size:
                raise DataError(f"{path}: truncated record at byte offset {pos}")
            offsets.append(pos)
            lengths.append(n)
            pos += n
    return np.asarray(offsets, np.int64), np.asarray(lengths, np.int64)


class TFRecord(RecordFiles):
    """Images in TFRecord files of ``tf.train.Example`` protos.

    Each example holds the encoded image as bytes under ``image_key`` and the label as an int64
    (class index) or float under ``label_key``: the TensorFlow ImageNet convention by default.
    DALI's index files (``<file>.idx``, made by its ``tfrecord2idx`` script) give the records'
    offsets; without them the files' length fields are walked once, in memory. Examples are
    parsed with the ``protobuf`` runtime; DALI decodes the images::

        root/
          train-00000-of-00002.tfrecord      # read in name order
          train-00000-of-00002.tfrecord.idx  # optional: "offset size" lines
          train-00001-of-00002.tfrecord
          ...

    Every record's length CRC and data CRC-32C (masked, as TFRecord specifies) are verified as
    it is read; a mismatch raises DataError naming the file and the byte offset.

    Records are addressed one by one, so this source is index-driven (same batches whatever
    the number of devices; ``validation_split`` works).

    Args:
        path: a TFRecord file or a directory of them (``.tfrecord``, ``.tfrecords``, ``.tfrec``).
        image_key: the feature holding the encoded image.
        label_key: the feature holding the label.
        **settings: the image settings, :class:`~easyfit.data.ImageFolder`'s keyword arguments
            (``image_size``, ``augment``, ``normalize``, ...: ``easyfit.data.images.ImageOptions``).

    Example:
        >>> import easyfit as ef
        >>> train = ef.data.TFRecord(MNIST_FORMATS["tfrecord"] + "/train")
        >>> len(train), train.image_shape, len(train.files)
        (200, (28, 28, 1), 2)
    """

    def __init__(
        self,
        path: str | os.PathLike,
        image_key: str = "image/encoded",
        label_key: str = "image/class/label",
        **settings: Unpack[ImageOptions],
    ):
        root = os.fspath(path)
        self.image_key, self.label_key = image_key, label_key
        self.files = list_files(root, TFRECORD_SUFFIXES, "TFRecord")
        self._stamp_files()
        parts = []
        for k, path_k in enumerate(self.files):
            try:
                size = storage_for(path_k).size(path_k)
                idx = index_file(path_k)
                offsets, lengths = _read_index(idx, size) if idx else _walk(path_k, size)
            except PermissionError as e:
                raise DataError(f"{path_k}: cannot be read ({e.strerror})") from None
            parts.append((np.full(len(offsets), k, np.int32), offsets, lengths))
        self._set_ranges(parts)
        self._example = tf_example()
        RecordFiles.__init__(self, root, None, ImageSettings.of("TFRecord", settings))

    def parse(self, index: int, raw: bytes) -> tuple[bytes, Any]:
        from google.protobuf.message import DecodeError

        problem = crc_problem(raw)
        if problem:
            raise DataError(f"{self.locate(index)}: {problem}")
        n = _LENGTH.unpack_from(raw)[0]
        try:
            features = self._example.FromString(raw[12 : 12 + n]).features.feature
        except DecodeError:
            raise DataError(f"{self.locate(index)}: not a tf.train.Example") from None
        if self.image_key not in features or self.label_key not in features:
            raise DataError(
                f"{self.locate(index)}: no {self.image_key!r} and {self.label_key!r} "
                f"features (found {sorted(features)}); pass image_key= and "
                "label_key="
            )
        image, label = features[self.image_key], features[self.label_key]
        if not image.bytes_list.value:
            raise DataError(f"{self.locate(index)}: feature {self.image_key!r} holds no bytes")
        values = label.int64_list.value or label.float_list.value
        if len(values) != 1:
            raise DataError(
                f"{self.locate(index)}: feature {self.label_key!r} holds "
                f"{len(values)} values; easyfit reads one label per image"
            )
        return image.bytes_list.value[0], values[0]

    def settings(self) -> dict[str, Any]:
        return {**self.image_settings(), "image_key": self.image_key, "label_key": self.label_key}

    def describe(self) -> str:
        return f"TFRecord({self.root!r}: {self.num_samples} records in {len(self.files)} files)"


register(
    Format("tfrecord", TFRecord, holding(*TFRECORD_SUFFIXES), suffixes=TFRECORD_SUFFIXES, object_storage=True)
)
