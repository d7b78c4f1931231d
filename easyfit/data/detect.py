"""Which source reads a directory: decided from what it holds."""

from __future__ import annotations

import os

from ..errors import DataError
from . import object_store
from .sources.base import Source
from .sources.caffe2 import Caffe2LMDB, is_lmdb
from .sources.folder import IMAGE_EXTENSIONS, ImageFolder, entries
from .sources.image_csv import ImageCSV
from .sources.numpy_folder import NumpyFolder
from .sources.parquet import Parquet, is_parquet_pattern
from .sources.recordio import RecordIO
from .sources.segmentation import SegmentationFolder, is_segmentation_folder
from .sources.tfrecord import TFRECORD_SUFFIXES, TFRecord
from .sources.webdataset import WebDataset

__all__ = ["detect"]

_BY_SUFFIX: tuple[tuple[tuple[str, ...], type[Source]], ...] = (
    ((".rec",), RecordIO),
    ((".tar",), WebDataset),
    (TFRECORD_SUFFIXES, TFRecord),
    ((".parquet",), Parquet),
)


#: What Hugging Face ``datasets``' ``save_to_disk`` writes for a ``DatasetDict``, beside a folder
#: per split (each of Arrow files, ``dataset_info.json`` and ``state.json``).
_SAVED_DATASET_DICT = "dataset_dict.json"


def _arrow_files(path: str, names: list[str] | None = None) -> DataError | None:
    """The error for a folder (or file) of Arrow files, as Hugging Face ``datasets``'
    ``save_to_disk`` writes (``data-00000-of-00001.arrow``, ``state.json``), or None."""
    if names is None:
        found = path.lower().endswith(".arrow")
    else:
        found = any(n.endswith(".arrow") for n in names) or _SAVED_DATASET_DICT in names
    if not found:
        return None
    return DataError(
        f"{path}: these are Arrow files (Hugging Face datasets' save_to_disk), which easyfit "
        "does not read; write them as Parquet with to_parquet "
        "(datasets.load_from_disk(path).to_parquet('data/train.parquet'), read as "
        "ef.data.Parquet), or load them and pass arrays: fit(x, y)"
    )


def _class_folder_kind(root: str) -> type[Source]:
    """ImageFolder or NumpyFolder, from the first data file found in the class folders."""
    for entry in sorted(entries(root, "dir"), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        for f in os.scandir(entry.path):
            name = f.name.lower()
            if name.endswith(".npy"):
                return NumpyFolder
            if name.endswith(IMAGE_EXTENSIONS):
                return ImageFolder
    return ImageFolder  # its own checks say what is missing


def _remote_kind(url: str) -> type[Source]:
    """The source class for ``s3://bucket/prefix``: class folders of images, WebDataset or
    TFRecord shards (the prefix, or one object); the other formats are refused by name rather
    than read as class folders (``images/`` and ``masks/`` would be two classes)."""
    found = [kind for suffixes, kind in _BY_SUFFIX if url.lower().endswith(suffixes)]
    if not found:
        listed = object_store.listing(url)
        names = [e.name.lower() for e in listed.entries(url)]
        found = [kind for suffixes, kind in _BY_SUFFIX if any(n.endswith(suffixes) for n in names)]
        if len(found) > 1:
            raise DataError(f"{url}: holds files of several formats ({', '.join(k.__name__ for k in found)})")
        if "data.mdb" in names:
            found.append(Caffe2LMDB)
        if {e.name for e in listed.entries(url, "dir")} == {"images", "masks"}:
            found.append(SegmentationFolder)
    if found and found[0] in (WebDataset, TFRecord):  # shards read by ranged GETs
        return found[0]
    if found:
        raise DataError(
            f"{url}: {found[0].__name__} data on object storage is not read by easyfit yet (s3:// "
            "works for class folders of images, WebDataset and TFRecord shards); copy it to a "
            "local disk (aws s3 sync), or store it in one of those formats"
        )
    return ImageFolder  # its own checks say what is missing


def detect(path: str | os.PathLike) -> type[Source]:
    """The source class for ``path``, from its contents.

    * a directory holding ``data.mdb``: :class:`~easyfit.data.Caffe2LMDB`;
    * ``.rec`` files (with their ``.idx``): :class:`~easyfit.data.RecordIO`;
    * ``.tar`` shards: :class:`~easyfit.data.WebDataset`;
    * ``.tfrecord``/``.tfrecords``/``.tfrec`` files (with their ``.idx``):
      :class:`~easyfit.data.TFRecord`;
    * ``.parquet`` files, or a ``data/`` folder of them (Hugging Face's layout):
      :class:`~easyfit.data.Parquet`;
    * exactly two folders, ``images/`` and ``masks/``: :class:`~easyfit.data.SegmentationFolder`;
    * class folders of ``.npy`` files: :class:`~easyfit.data.NumpyFolder`;
    * class folders of images: :class:`~easyfit.data.ImageFolder`.

    A folder of Arrow files (Hugging Face ``datasets``' ``save_to_disk``) is refused with a
    DataError that says how to write it as Parquet.

    A single file is recognised by its suffix (a ``.csv`` file: :class:`~easyfit.data.ImageCSV`),
    and so is a glob pattern of ``.parquet`` files (``"hf/data/train-*.parquet"``).

    Example:
        >>> import easyfit as ef
        >>> from easyfit.data.detect import detect
        >>> [detect(MNIST_FORMATS[f] + "/train").__name__ for f in ("lmdb", "webdataset", "npy")]
        ['Caffe2LMDB', 'WebDataset', 'NumpyFolder']
    """
    path = os.fspath(path)
    if object_store.is_url(path):
        return _remote_kind(path)
    if is_parquet_pattern(path):
        return Parquet
    if os.path.isfile(path):
        by_suffix: tuple[tuple[tuple[str, ...], type[Source]], ...] = (*_BY_SUFFIX, ((".csv",), ImageCSV))
        for suffixes, kind in by_suffix:
            if path.lower().endswith(suffixes):
                return kind
        arrow = _arrow_files(path)
        if arrow is not None:
            raise arrow
        raise DataError(
            f"{path}: a file easyfit cannot read; expected a directory, or a .rec, .tar, .tfrecord, "
            ".parquet or .csv file"
        )
    if not os.path.isdir(path):
        raise DataError(f"{path}: no such directory")
    if is_lmdb(path):
        return Caffe2LMDB
    names = [e.name.lower() for e in entries(path)]
    found = [kind for suffixes, kind in _BY_SUFFIX if any(n.endswith(suffixes) for n in names)]
    if len(found) > 1:
        raise DataError(
            f"{path}: holds files of several formats "
            f"({', '.join(k.__name__ for k in found)}); give one source explicitly, "
            "e.g. ef.data.RecordIO(path)"
        )
    if found:
        return found[0]
    data = os.path.join(path, "data")
    if os.path.isdir(data) and any(e.name.lower().endswith(".parquet") for e in entries(data)):
        return Parquet  # Hugging Face's layout
    arrow = _arrow_files(path, names)
    if arrow is not None:
        raise arrow
    return SegmentationFolder if is_segmentation_folder(path) else _class_folder_kind(path)
