"""Caffe2 LMDB (reference program 1's format), read by DALI's ``fn.readers.caffe2``."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import DataError
from ..augment import apply_drawn, refuse_random_crop
from ..images import SAMPLED, EncodedImages, ImageOptions, ImageSettings
from ..protos import caffe2_messages
from .base import READER, ReadAtStart, ReaderSource, int32_labels
from .lmdb_walk import walk_lmdb
from .registry import FIRST, Format, register

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Caffe2LMDB", "is_lmdb"]


def is_lmdb(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an LMDB environment directory (holds ``data.mdb``)."""
    return os.path.isfile(os.path.join(path, "data.mdb"))


class Caffe2LMDB(EncodedImages, ReaderSource):
    """An LMDB of serialized Caffe2 ``TensorProtos``: an image and a label per record.

    The image is either encoded (``data_type=STRING``, JPEG/PNG/... bytes, decoded by DALI) or
    raw (``BYTE`` with dims ``(H, W[, C])``); the label a single ``INT32`` (class index) or
    ``FLOAT``. This is the layout of Caffe2's and DALI's MNIST/ImageNet LMDBs::

        db/
          data.mdb      # the records, keyed in reading order
          lock.mdb      # (optional; never written by easyfit: DALI opens read-only, no lock)

    DALI's reader chooses the order (shuffled in a buffer when training) and shards by device,
    so this source is reader-driven: exactly-once evaluation holds, but the batches depend on
    the number of pipelines and ``validation_split`` is not available (see
    [Data formats](data-formats.md#index-driven-and-reader-driven-sources)).

    Building the source reads every record once with the ``lmdb`` package, without decoding,
    in child processes that split the records by key range over the available cores,
    before DALI touches the file: DALI's reader crashes the process on a damaged database
    (SIGSEGV on a smashed page, SIGBUS on a truncated file). So a damaged database, a record
    that is not a ``TensorProtos`` or, when the records hold encoded images, an image that
    fails the host's checks of other sources' files raises DataError naming the database and the
    first such record in key order (``<path>: record k (in key order): <what is wrong>``). The
    same pass gives every label of encoded records (:meth:`known_labels`). Raw (``BYTE``)
    images are not checked: DALI does not decode them. A ``data.mdb`` written since that pass
    (its size or modification time changed) is refused by name before the next chunk is read.

    Args:
        path: the LMDB directory.
        **settings: the image settings, :class:`~easyfit.data.ImageFolder`'s keyword arguments
            (``image_size``, ``augment``, ``normalize``, ...: ``easyfit.data.images.ImageOptions``).
            Raw pixels, not decoded, take ``image_size``, ``color_mode``, ``transform`` and
            ``augment`` only.

    Example:
        >>> import easyfit as ef
        >>> train = ef.data.Caffe2LMDB(MNIST_FORMATS["lmdb"] + "/train")
        >>> len(train), train.image_shape, train.label_dtype
        (200, (28, 28, 1), dtype('int32'))
    """

    def __init__(
        self,
        path: str | os.PathLike,
        **settings: Unpack[ImageOptions],
    ):
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise DataError(f"{self.path}: no such directory")
        if not is_lmdb(self.path):
            raise DataError(f"{self.path}: not an LMDB (no data.mdb)")
        mdb = os.path.join(self.path, "data.mdb")
        self._read_at_start = ReadAtStart([mdb], "records (checked, counted and labelled)")
        self._num, every_label = walk_lmdb(self.path)  # every record read and checked
        records = [(self.locate(k), image, label) for k, (image, label) in enumerate(self._records(SAMPLED))]
        self.encoded = records[0][1].ndim == 1
        labels = np.concatenate([np.ravel(r[2]) for r in records])
        self._label_dtype = np.dtype(np.int32 if labels.dtype.kind in "iu" else np.float32)
        self._labels = None
        if self.encoded and every_label is not None:
            self._labels = (
                int32_labels(every_label, self.locate)
                if self._label_dtype.kind == "i"
                else every_label.astype(np.float32)
            )
        if self.encoded:
            images = ImageSettings.of("Caffe2LMDB", settings)
            EncodedImages.__init__(self, images, lambda: [(n, bytes(a)) for n, a, _ in records], self.path)
        else:
            self._init_raw(records, settings)

    def _records(self, stop: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(image, label)`` of the records in key order (safe once ``walk_lmdb`` passed):
        encoded bytes as 1-D uint8, raw pixels as (H, W[, C]) uint8."""
        import lmdb

        messages = caffe2_messages()["TensorProtos"]
        env = lmdb.open(self.path, readonly=True, lock=False)
        try:
            with env.begin() as txn:
                for k, value in enumerate(txn.cursor().iternext(keys=False)):
                    if stop is not None and k >= stop:
                        break
                    image, label = messages.FromString(value).protos[:2]
                    if image.string_data:
                        data = np.frombuffer(image.string_data[0], np.uint8)
                    else:
                        data = np.frombuffer(image.byte_data, np.uint8).reshape([int(d) for d in image.dims])
                    lab = (
                        np.asarray(label.int32_data, np.int32)
                        if label.int32_data
                        else np.asarray(label.float_data, np.float32)
                    )
                    yield data, lab
        finally:
            env.close()

    def known_labels(self) -> np.ndarray | None:
        """Every label in key order, read when the source was built (encoded records)."""
        return self._labels

    def records_layout(self) -> tuple[np.ndarray, ...]:
        """What the walk read: the number of records and (encoded records) every label; a
        resumed fit's data fingerprint compares it with the backup's."""
        known = () if self._labels is None else (self._labels,)
        return (np.asarray([self._num], np.int64), *known)

    def _init_raw(self, records: list[tuple[str, np.ndarray, Any]], settings: Mapping[str, Any]) -> None:
        """Sets the settings of raw pixels: no decoding, so only a resize and ``transform``."""
        refuse_random_crop(settings.get("augment"), self.path)
        given = ImageSettings.of("Caffe2LMDB", settings)  # the arguments' own checks
        if given.normalize is not None or given.eval_crop is not None or given.crop_to_aspect_ratio:
            raise ValueError(
                f"{self.path}: normalize, eval_crop and crop_to_aspect_ratio apply to encoded "
                "images; these records hold raw pixels"
            )
        if given.pad_to_aspect_ratio:
            raise ValueError(f"{self.path}: pad_to_aspect_ratio applies to encoded images, not raw pixels")
        image_size, color_mode = given.image_size, given.color_mode
        self.augment, transform = given.augment, given.transform
        shapes = [r[1].shape if r[1].ndim == 3 else (*r[1].shape, 1) for r in records]
        stored = "grayscale" if shapes[0][2] == 1 else "rgb"
        if color_mode not in (None, stored):
            raise DataError(
                f"{self.path}: color_mode={color_mode!r} but the records hold raw {stored} pixels"
            )
        self.decoder, self.transform, self.color_mode = "cpu", transform, stored
        self.interpolation = given.interpolation
        self.resize = image_size is not None
        named = [(r[0], b"") for r in records]  # raw pixels: no header to tell a turned image
        self.image_size = image_size or self._common_size(named, shapes, self.path)

    @property
    def num_samples(self) -> int:
        return self._num

    @property
    def label_dtype(self) -> np.dtype:
        return self._label_dtype

    def read(
        self,
        *,
        shard_id: int,
        num_shards: int,
        shuffle: bool,
        device: str,
        draws: dict[str, Any] | None = None,
    ) -> tuple[Any, Any]:
        from nvidia.dali import fn, types

        # DALI's stub returns "a node, a sequence of nodes or None"; this reader gives two nodes
        data, labels = fn.readers.caffe2(
            path=self.path,
            shard_id=shard_id,  # type: ignore[misc]
            num_shards=num_shards,
            random_shuffle=shuffle,
            pad_last_batch=True,
            name=READER,
        )
        if self.encoded:
            images = self.decode(data, device=device, draws=draws)
        else:
            images = fn.reshape(data, layout="HWC")
            images = images.gpu() if device == "gpu" else images
            if self.resize:
                resize = self.image_recipe().resize_options()
                images = fn.resize(
                    images, size=list(self.image_size), dtype=types.DALIDataType.UINT8, **resize
                )
            if self.transform is not None:
                images = self.transform(images)
            if draws is not None:
                images = apply_drawn(self.augment, images, draws)
        labels = fn.reshape(labels, shape=[])
        return images, (labels.gpu() if device == "gpu" else labels)

    def check_unchanged(self) -> None:
        """DataError when ``data.mdb`` changed since its records were walked and checked."""
        self._read_at_start.check_all()

    def locate(self, index: int) -> str:
        return f"{self.path}: record {index} (in key order)"

    def sibling(self, path: str | os.PathLike) -> Caffe2LMDB | None:
        if not is_lmdb(path):
            return None
        other = Caffe2LMDB(path, **self.image_settings())
        self.check_same_images(other, self.path, other.path)
        return other

    def describe(self) -> str:
        return f"Caffe2LMDB({self.path!r}: {self._num} records)"


register(Format("caffe2-lmdb", Caffe2LMDB, lambda listing: "data.mdb" in listing.names(), priority=FIRST))
