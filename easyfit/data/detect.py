"""Which source reads a path: decided from what it holds, by the formats each source's module
registers (``easyfit.data.sources.registry``), from one listing of a folder (its storage's,
``easyfit.data.storage``: a local folder and a prefix in a bucket alike)."""

from __future__ import annotations

import os

from ..errors import DataError
from .sources.base import Source
from .sources.registry import FILES, Format, formats, register
from .storage import Listing, Storage, storage_for

__all__ = ["detect"]

#: What Hugging Face ``datasets``' ``save_to_disk`` writes for a ``DatasetDict``, beside a folder
#: per split (each of Arrow files, ``dataset_info.json`` and ``state.json``).
_SAVED_DATASET_DICT = "dataset_dict.json"


def _arrow_refusal(path: str) -> DataError:
    """The error for a folder (or file) of Arrow files, as Hugging Face ``datasets``'
    ``save_to_disk`` writes (``data-00000-of-00001.arrow``, ``state.json``)."""
    return DataError(
        f"{path}: these are Arrow files (Hugging Face datasets' save_to_disk), which easyfit "
        "does not read; write them as Parquet with to_parquet "
        "(datasets.load_from_disk(path).to_parquet('data/train.parquet'), read as "
        "ef.data.Parquet), or load them and pass arrays: fit(x, y)"
    )


register(
    Format(
        "arrow",
        None,
        lambda listing: bool(listing.with_suffix((".arrow",))) or _SAVED_DATASET_DICT in listing.names(),
        priority=FILES + 20,
        suffixes=(".arrow",),
        refusal=_arrow_refusal,
    )
)


def _read(fmt: Format, path: str, storage: Storage) -> type[Source]:
    """``fmt``'s source for ``path``, or the DataError that says why it is not read."""
    if fmt.source is None:
        raise (fmt.refusal(path) if fmt.refusal else DataError(f"{path}: {fmt.name} data is not read"))
    if storage.remote and not fmt.object_storage:
        works = ", ".join(sorted({f.title for f in formats() if f.object_storage and f.source}))
        raise DataError(
            f"{path}: {fmt.title} data on object storage is not read by easyfit yet (s3:// works "
            f"for {works}); copy it to a local disk (aws s3 sync), or store it in one of those formats"
        )
    return fmt.source


def _in_folder(path: str, listing: Listing, storage: Storage) -> type[Source]:
    """The format of folder ``path``: the first priority at which one recognises its listing."""
    known = formats()
    for priority in sorted({f.priority for f in known}):
        found = [f for f in known if f.priority == priority and f.recognise and f.recognise(listing)]
        if len({f.title for f in found}) > 1:
            raise DataError(
                f"{path}: holds files of several formats "
                f"({', '.join(f.title for f in found)}); give one source explicitly, "
                "e.g. ef.data.RecordIO(path)"
            )
        if found:
            return _read(found[0], path, storage)
    raise DataError(f"{path}: no format recognises this folder")


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
    DataError that says how to write it as Parquet. In a bucket (``s3://``), the formats that
    are not read from one are refused by name.

    A single file is recognised by its suffix (a ``.csv`` file: :class:`~easyfit.data.ImageCSV`),
    and so is a glob pattern of ``.parquet`` files (``"hf/data/train-*.parquet"``).

    Each format says how it is recognised where its source is defined
    (``easyfit.data.sources.registry``); a folder is listed once.

    Example:
        >>> import easyfit as ef
        >>> from easyfit.data.detect import detect
        >>> [detect(MNIST_FORMATS[f] + "/train").__name__ for f in ("lmdb", "webdataset", "npy")]
        ['Caffe2LMDB', 'WebDataset', 'NumpyFolder']
    """
    path = os.fspath(path)
    storage = storage_for(path)
    known = formats()
    pattern = next((f for f in known if f.pattern is not None and f.pattern(path)), None)
    if pattern is not None:
        return _read(pattern, path, storage)
    listing = storage.listdir(path)
    if listing is not None:
        return _in_folder(path, listing, storage)
    if not storage.isfile(path):
        raise DataError(f"{path}: no such directory")
    for fmt in known:
        if fmt.suffixes and path.lower().endswith(fmt.suffixes):
            return _read(fmt, path, storage)
    expected = [f.suffixes[0] for f in known if f.suffixes and f.source is not None]
    raise DataError(
        f"{path}: a file easyfit cannot read; expected a directory, or a "
        f"{', '.join(expected[:-1])} or {expected[-1]} file"
    )
