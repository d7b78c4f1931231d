"""Caffe2 LMDB (reference program 1's format), read by DALI's ``fn.readers.caffe2``."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import DataError
from ..augment import apply_drawn, refuse_random_crop
from ..images import SAMPLED, EncodedImages, first_line, image_problem
from .base import READER, ReaderSource

__all__ = ["Caffe2LMDB", "is_lmdb"]

_VERIFY_BYTES = 32 << 20  # encoded bytes per batch read to verify the records


def is_lmdb(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an LMDB environment directory (holds ``data.mdb``)."""
    return os.path.isfile(os.path.join(path, "data.mdb"))


def _concatenated(batch: Any) -> tuple[bytes, list[int]]:
    """The bytes of a DALI batch of 1-D uint8 samples, one after the other, and where sample
    ``k`` starts (``ends[k]``) and ends (``ends[k + 1]``): one copy for the whole batch."""
    sizes = np.array(batch.shape(), np.int64).reshape(-1)
    buffer = np.empty(int(sizes.sum()), np.uint8)
    batch.copy_to_external(ctypes.c_void_p(buffer.ctypes.data))
    return buffer.tobytes(), [0, *np.cumsum(sizes).tolist()]


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
    the number of pipelines and ``validation_split`` is not available (see docs/data-formats.md).

    Encoded records are verified once, before the first pipeline that decodes them is built
    (:meth:`check`, called by :func:`~easyfit.data.loader.make_loader`): DALI reads every
    record in key order, without decoding, and each image is checked on the host like the
    files of other sources (:func:`~easyfit.data.images.image_problem`), since DALI 2.4's CPU
    decoders can crash the process on a broken image. A broken one raises DataError naming
    it (``<path>: record k (in key order): <what is wrong>``). That pass also gives every
    label (:meth:`known_labels`). Raw (``BYTE``) records are not read ahead.

    Args:
        path: the LMDB directory.
        image_size, color_mode, decoder, transform, augment, normalize, eval_crop: as for
            :class:`~easyfit.data.ImageFolder`.

    Example:
        >>> import easyfit as ef
        >>> train = ef.data.Caffe2LMDB(MNIST_FORMATS["lmdb"] + "/train")
        >>> len(train), train.image_shape, train.label_dtype
        (200, (28, 28, 1), dtype('int32'))
    """

    def __init__(self, path: str | os.PathLike, image_size: tuple[int, int] | None = None,
                 color_mode: str | None = None, decoder: str = "auto",
                 transform: Callable[[Any], Any] | None = None,
                 augment: Callable[[Any], Any] | None = None, normalize: Any = None,
                 eval_crop: float | None = None):
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise DataError(f"{self.path}: no such directory")
        if not is_lmdb(self.path):
            raise DataError(f"{self.path}: not an LMDB (no data.mdb)")
        self.augment = augment
        self._labels: np.ndarray | None = None
        self._verified = False
        self._num, records = self._probe()
        images = [r[1] for r in records]
        self.encoded = images[0].ndim == 1
        self._record_bytes = int(np.mean([r[1].nbytes for r in records]))
        labels = np.concatenate([np.ravel(r[2]) for r in records])
        self._label_dtype = np.dtype(np.int32 if labels.dtype.kind in "iu" else np.float32)
        if self.encoded:
            self._init_images(lambda: [(name, bytes(a)) for name, a, _ in records], image_size,
                              color_mode, decoder, transform, self.path, normalize, eval_crop)
        else:
            refuse_random_crop(augment, self.path)
            if normalize is not None or eval_crop is not None:
                raise ValueError(f"{self.path}: normalize and eval_crop apply to encoded images; "
                                 "these records hold raw pixels")
            self._init_raw(records, image_size, color_mode, transform)

    def _probe(self) -> tuple[int, list[tuple[str, np.ndarray, np.ndarray]]]:
        """Number of records, and ``(name, image, label)`` of the first few."""
        from nvidia.dali import fn, pipeline_def

        # DALI's pipeline_def stub types device_id as int; its docs take None (CPU only)
        @pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1,  # type: ignore[call-overload]
                      exec_async=False, exec_pipelined=False)
        def probe():
            data, labels = fn.readers.caffe2(path=self.path, name=READER)
            return data, labels, fn.get_property(data, key="source_info")

        pipe = probe()
        try:
            pipe.build()
            num = pipe.reader_meta(READER)["epoch_size"]
            if num == 0:
                raise DataError(f"{self.path}: the LMDB holds no records")
            records = []
            for _ in range(min(num, SAMPLED)):
                data, labels, info = pipe.run()
                records.append((bytes(np.asarray(info.at(0))).decode(errors="replace"),
                                np.asarray(data.at(0)), np.asarray(labels.at(0))))
        except RuntimeError as e:
            raise DataError(f"{self.path}: cannot be read as a Caffe2 LMDB "
                            f"({first_line(e)})") from None
        finally:
            del pipe
        return num, records

    def check(self) -> None:
        """Verifies every encoded record once (see the class docstring); raises DataError."""
        if self.encoded and not self._verified:
            self._labels = self._verify()
            self._verified = True

    def _verify(self) -> np.ndarray | None:
        """Checks every encoded record in key order; every label when each record holds one."""
        from nvidia.dali import fn, pipeline_def

        batch = int(np.clip(_VERIFY_BYTES // max(self._record_bytes, 1), 64, 8192))
        batch = min(batch, self._num)

        # DALI's pipeline_def stub types device_id as int; its docs take None (CPU only)
        @pipeline_def(batch_size=batch, num_threads=1, device_id=None, prefetch_queue_depth=2)  # type: ignore[call-overload]
        def records():
            data, labels = fn.readers.caffe2(path=self.path, pad_last_batch=True, name=READER)
            return data, labels

        pipe, labels, done = records(), [], 0
        try:
            pipe.build()
            while done < self._num:
                data, label = pipe.run()
                count = min(batch, self._num - done)
                raw, ends = _concatenated(data)
                for k in range(count):
                    problem = image_problem(raw[ends[k]:ends[k + 1]])
                    if problem:
                        raise DataError(f"{self.locate(done + k)}: {problem}")
                labels.append(label.as_array()[:count].reshape(count, -1)
                              if label.is_dense_tensor() else None)
                done += count
        except RuntimeError as e:
            raise DataError(f"{self.path}: cannot be read as a Caffe2 LMDB "
                            f"({first_line(e)})") from None
        finally:
            del pipe
        parts = [part for part in labels if part is not None and part.shape[1] == 1]
        if len(parts) < len(labels):
            return None
        return np.concatenate(parts)[:, 0].astype(self._label_dtype)

    def known_labels(self) -> np.ndarray | None:
        """Every label in key order, once :meth:`check` has read them (encoded records)."""
        return self._labels

    def _init_raw(self, records, image_size, color_mode, transform) -> None:
        shapes = [r[1].shape if r[1].ndim == 3 else (*r[1].shape, 1) for r in records]
        stored = "grayscale" if shapes[0][2] == 1 else "rgb"
        if color_mode not in (None, stored):
            raise DataError(f"{self.path}: color_mode={color_mode!r} but the records hold raw "
                            f"{stored} pixels")
        self.decoder, self.transform, self.color_mode = "cpu", transform, stored
        self.resize = image_size is not None
        self.image_size = (tuple(image_size) if image_size is not None else
                           self._common_size([r[0] for r in records], shapes, self.path))

    @property
    def num_samples(self) -> int:
        return self._num

    @property
    def label_dtype(self) -> np.dtype:
        return self._label_dtype

    def read(self, *, shard_id: int, num_shards: int, shuffle: bool, device: str,
             draws: dict[str, Any] | None = None) -> tuple[Any, Any]:
        from nvidia.dali import fn, types

        # DALI's stub returns "a node, a sequence of nodes or None"; this reader gives two nodes
        data, labels = fn.readers.caffe2(path=self.path, shard_id=shard_id,  # type: ignore[misc]
                                         num_shards=num_shards, random_shuffle=shuffle,
                                         pad_last_batch=True, name=READER)
        if self.encoded:
            images = self.decode(data, device=device, draws=draws)
        else:
            images = fn.reshape(data, layout="HWC")
            images = images.gpu() if device == "gpu" else images
            if self.resize:
                images = fn.resize(images, size=list(self.image_size),
                                   dtype=types.DALIDataType.UINT8)
            if self.transform is not None:
                images = self.transform(images)
            if draws is not None:
                images = apply_drawn(self.augment, images, draws)
        labels = fn.reshape(labels, shape=[])
        return images, (labels.gpu() if device == "gpu" else labels)

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
