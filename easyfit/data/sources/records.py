"""Encoded images stored as byte ranges of larger files (RecordIO, TFRecord, WebDataset).

Such a file is indexed once (from its index file, or by walking its headers) into
``(file, offset, length)`` per sample. Then every sample is addressable: ``feed(indices)``
reads those byte ranges with ``os.pread`` (no decoding in Python), DALI decodes them. The
sources are therefore index-driven, like image folders: the same order, shards, masks and
validation splits whatever the device count.
"""

from __future__ import annotations

import abc
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ...errors import DataError
from ..images import EncodedImages, ImageSettings, sample_positions
from ..storage import Storage, storage_for, storage_of
from ..validation.encoded import image_problem
from .base import IndexedSource, ReadAtStart, bad_sample, int32_labels, outside_classes

__all__ = ["RecordFiles", "list_files"]


def list_files(root: str, suffixes: tuple[str, ...], what: str) -> list[str]:
    """Sorted files of ``root`` (a directory, or one file) ending with ``suffixes``."""
    storage = storage_for(root)
    if storage.isfile(root):
        return [root]
    listing = storage.listdir(root)
    if listing is None:
        raise DataError(f"{root}: no such file or directory")
    files = [e.path for e in listing.with_suffix(suffixes)]
    if not files:
        raise DataError(f"{root}: no {what} files ({', '.join(suffixes)})")
    return files


class RecordFiles(EncodedImages, IndexedSource):
    """Base of sources whose samples are byte ranges of ``files``.

    Subclasses fill ``files`` and call ``_stamp_files`` before they read them, fill ``_file``
    (file index per sample), ``_offset`` and ``_length`` (byte range per sample), then call
    ``RecordFiles.__init__``; and implement :meth:`parse`.

    The byte ranges (and the labels, where the index holds them) describe the files as they
    were read then: a file that changed since (one ``os.stat`` a file and feed) is refused by
    name, never read at ranges that no longer hold its records.
    """

    files: list[str]
    #: Whether a record sampled as the source is built (its labels' dtype, its images'
    #: settings) that cannot be read or parsed raises DataError; False (``easyfit check``,
    #: which lists every one): it is left out of the sample.
    strict_sample: bool = True
    _file: np.ndarray
    _offset: np.ndarray
    _length: np.ndarray

    @property
    def _storage(self) -> Storage:
        """Where ``files`` are kept (``easyfit.data.storage``)."""
        return storage_of(self.files)

    def _stamp_files(self, what: str = "record offsets") -> None:
        """Stamps ``files`` before they are indexed (see :class:`~.base.ReadAtStart`)."""
        self._read_at_start = ReadAtStart(self.files, what)

    def _set_ranges(self, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """Sets ``_file``, ``_offset``, ``_length`` from ``(file, offset, length)`` per file."""
        files, offsets, lengths = zip(*parts, strict=True)
        self._file, self._offset = np.concatenate(files), np.concatenate(offsets)
        self._length = np.concatenate(lengths)

    def __init__(self, root: str, labels: np.ndarray | None, settings: ImageSettings) -> None:
        """Samples the records (their labels' dtype, their images' settings) once ``files``,
        ``_file``, ``_offset`` and ``_length`` are set; ``labels``: every label, when the
        index holds them."""
        self.root = root
        self._fds: dict[int, int] = {}  # file index -> open descriptor, shared by DALI's threads
        self._fds_lock = threading.Lock()
        if len(self._offset) == 0:
            raise DataError(f"{root}: no records")
        self._labels = labels
        self._label_limit: int | None = None  # classes the fed labels must be below (see limit_labels)
        self._early = np.zeros(len(self._offset), np.int32)  # labels fed before the limit was known
        self._early_fed = np.zeros(len(self._offset), bool)
        self._labels_lock = threading.Lock()
        self._checked = np.zeros(len(self._offset), bool)  # whole structure checked once
        picks, parsed = [], []
        for i in sample_positions(len(self._offset)).tolist():
            try:
                parsed.append(self.parse(i, self.read(i)))
                picks.append(i)
            except DataError:
                if self.strict_sample or (not parsed and i == len(self._offset) - 1):
                    raise
        if labels is None:
            kinds = {np.asarray(lab).dtype.kind for _, lab in parsed}
            self._label_dtype = np.dtype(np.float32 if "f" in kinds else np.int32)
        else:
            self._label_dtype = labels.dtype
        named = [(self.locate(i), image) for i, (image, _) in zip(picks, parsed, strict=True)]
        EncodedImages.__init__(self, settings, lambda: named, root)

    @abc.abstractmethod
    def parse(self, index: int, raw: bytes) -> tuple[bytes, Any]:
        """``(encoded image, label)`` from the bytes of record ``index``; DataError if bad."""

    def read(self, index: int) -> bytes:
        """The bytes of record ``index``."""
        length, offset = int(self._length[index]), int(self._offset[index])
        path = self.files[int(self._file[index])]
        if self._storage.remote:  # a ranged GET
            raw = self._storage.read(path, offset, length)
        else:  # the file kept open
            raw = os.pread(self._fd(int(self._file[index])), length, offset)
        if len(raw) != length:
            raise DataError(f"{self.locate(index)}: truncated ({len(raw)} of {length} bytes)")
        return raw

    def _fd(self, f: int) -> int:
        """An open descriptor of ``files[f]``, opened once however many threads ask at once."""
        with self._fds_lock:
            fd = self._fds.get(f)
            if fd is None:
                try:
                    fd = os.open(self.files[f], os.O_RDONLY)
                except OSError as e:
                    raise DataError(f"{self.files[f]}: cannot be read ({e.strerror or e})") from None
                self._fds[f] = fd
            return fd

    def records_layout(self) -> tuple[np.ndarray, ...]:
        """What the index read of the files: each record's file, byte range and (when the index
        holds them) label; a resumed fit's data fingerprint compares it with the backup's."""
        known = () if self._labels is None else (self._labels,)
        return (self._file, self._offset, self._length, *known)

    @property
    def num_samples(self) -> int:
        return len(self._offset)

    @property
    def num_feeds(self) -> int:
        return 2

    @property
    def label_dtype(self) -> np.dtype:
        return self._label_dtype

    def known_labels(self) -> np.ndarray | None:
        return self._labels

    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        images, labels = [], []
        for f in np.unique(self._file[indices]).tolist():  # the files as indexed, or refused
            self._read_at_start.check(f)
        remote = self._storage.remote  # GETs: waited on together
        raws = self._storage.map(self.read, indices.tolist()) if remote else None
        for j, i in enumerate(indices):
            image, label = self.parse(int(i), raws[j] if raws is not None else self.read(int(i)))
            problem = image_problem(image, whole=not self._checked[i])
            if problem:
                raise bad_sample(self, int(i), problem)
            self._checked[i] = True
            images.append(np.frombuffer(image, np.uint8))
            labels.append(label)
        if self._labels is not None:
            return images, self._labels[indices]
        return images, self._parsed_labels(indices, labels)

    def _parsed_labels(self, indices: np.ndarray, labels: list[Any]) -> np.ndarray:
        """The labels parsed from records ``indices``, every one checked (vectorised): class
        indices must be whole numbers that fit int32 (the dtype was inferred from a sample of
        the records; another record may hold a float or a huge value) and, once the model's
        classes are known, fewer than them."""
        if self._label_dtype.kind == "f":
            return np.asarray(labels, np.float32)
        out = int32_labels(np.asarray(labels), lambda j: self.locate(int(indices[j])))
        with self._labels_lock:
            if self._label_limit is None:
                self._early[indices], self._early_fed[indices] = out, True
            else:
                self._check_range(indices, out)
        return out

    def limit_labels(self, num_classes: int) -> None:
        if self._labels is not None or self._label_dtype.kind == "f":
            return  # known labels are checked whole; float labels are no class indices
        with self._labels_lock:
            self._label_limit = num_classes
            fed = np.flatnonzero(self._early_fed)
            self._check_range(fed, self._early[fed])

    def _check_range(self, indices: np.ndarray, labels: np.ndarray) -> None:
        assert self._label_limit is not None
        bad = np.flatnonzero((labels < 0) | (labels >= self._label_limit))
        if len(bad):
            j = int(bad[0])
            raise DataError(
                f"{self.locate(int(indices[j]))}: {outside_classes(int(labels[j]), self._label_limit)}"
            )

    def graph(self, *nodes: Any, device: str, draws: dict[str, Any] | None = None) -> tuple[Any, Any]:
        encoded, labels = nodes  # as feed() returns them
        images = self.decode(encoded, device=device, draws=draws)
        return images, (labels.gpu() if device == "gpu" else labels)

    def sample_problem(self, index: int) -> str | None:
        self._read_at_start.check(int(self._file[index]))
        image, _ = self.parse(index, self.read(index))
        return image_problem(image)

    def encoded_image(self, index: int) -> bytes | None:
        self._read_at_start.check(int(self._file[index]))
        return self.parse(index, self.read(index))[0]

    def locate(self, index: int) -> str:
        f = int(self._file[index])
        first = int(np.searchsorted(self._file, f))
        return f"{self.files[f]}: record {index - first} (byte offset {int(self._offset[index])})"

    def settings(self) -> dict[str, Any]:
        """Constructor arguments that give another split the same samples' form."""
        return self.image_settings()

    def sibling(self, path: str | os.PathLike) -> IndexedSource | None:
        try:
            # every concrete kind takes the path first (the abstract base declares no __init__)
            other = cast("Callable[..., RecordFiles]", type(self))(path, **self.settings())
        except DataError:
            return None
        self.check_same_images(other, self.root, other.root)
        return other

    def close(self) -> None:
        """Closes the open files (they reopen when needed)."""
        with self._fds_lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown, or a constructor that failed
            pass
