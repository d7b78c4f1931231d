"""WebDataset tar shards (``<key>.<image ext>`` + ``<key>.cls``), index-driven."""

from __future__ import annotations

import os
import tarfile
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import DataError
from ..images import ImageOptions, ImageSettings
from ..storage import storage_for
from .base import int32_labels
from .folder import IMAGE_EXTENSIONS
from .records import RecordFiles, list_files
from .registry import Format, holding, register

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["WebDataset"]


def _split(name: str) -> tuple[str, str]:
    """WebDataset's key and extension: the extension starts at the basename's first dot."""
    head, base = os.path.split(name)
    stem, _, ext = base.partition(".")
    return os.path.join(head, stem), ext.lower()


def _not_plain(m: tarfile.TarInfo) -> str | None:
    """Why member ``m`` cannot be read as a contiguous byte range of the tar, and the fix; None
    for a plain file (and a directory, which holds no bytes: skipped). A link's bytes are
    elsewhere; a sparse file's are stored without its holes, so its range is not its content."""
    if m.isfile() and not m.issparse():  # a regular (or contiguous) file, stored whole
        return None
    if m.isdir():
        return None
    kind = (
        "a sparse file (stored without its holes, as tar -S writes it)"
        if m.issparse()
        else f"a symbolic link to {m.linkname!r}"
        if m.issym()
        else f"a hard link to {m.linkname!r}"
        if m.islnk()
        else "a device node"
        if m.ischr() or m.isblk()
        else "a FIFO"
        if m.isfifo()
        else f"a member of type {m.type!r}"
    )
    return (
        f"member {m.name} is {kind}, not a plain file, so its bytes cannot be read where the tar "
        "stores them; write the shard with plain files (tar without -S, with --dereference "
        "--hard-dereference; or Python's tarfile, or webdataset's ShardWriter)"
    )


def _scan(path: str, label_ext: str) -> tuple[list[tuple[int, int]], list[int], list[str]]:
    """``(image byte ranges, labels, keys)`` of the samples of one tar shard."""
    images: dict[str, tuple[int, int]] = {}
    labels: dict[str, int] = {}
    image_exts = tuple(e.lstrip(".") for e in IMAGE_EXTENSIONS)
    storage = storage_for(path)  # in a bucket: its headers read by ranged GETs
    size = storage.size(path)
    try:
        with storage.open(path) as f, tarfile.open(path, "r:", fileobj=f) as tar:
            for m in tar:
                problem = _not_plain(m)
                if problem:
                    raise DataError(f"{path}: {problem}")
                if m.isdir():
                    continue
                if m.offset_data + m.size > size:
                    raise DataError(
                        f"{path}: truncated tar file (member {m.name} ends at byte "
                        f"{m.offset_data + m.size}, the file has {size})"
                    )
                key, ext = _split(m.name)
                if ext in image_exts:
                    images[key] = (m.offset_data, m.size)
                elif ext == label_ext:
                    member = tar.extractfile(m)
                    assert member is not None  # a regular file (isfile above)
                    text = member.read().decode(errors="replace").strip()
                    try:
                        labels[key] = int(text)
                    except ValueError:
                        raise DataError(
                            f"{path}: {m.name} holds {text[:20]!r}, not an integer class label"
                        ) from None
            tar.fileobj.seek(tar.offset)
            end = tar.fileobj.read(512)
            if len(end) < 512 or end.strip(b"\0"):
                raise DataError(
                    f"{path}: truncated tar file (no end-of-archive block after byte {tar.offset})"
                )
    except (tarfile.TarError, OSError) as e:
        if "unexpected end of data" in str(e):
            raise DataError(f"{path}: truncated tar file ({e})") from None
        raise DataError(f"{path}: not a readable tar file ({e})") from None
    missing = [k for k in images if k not in labels]
    if missing:
        raise DataError(
            f"{path}: sample {missing[0]!r} has an image but no .{label_ext} label"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    keys = list(images)
    return [images[k] for k in keys], [labels[k] for k in keys], keys


class WebDataset(RecordFiles):
    """Images in WebDataset tar shards: each sample is ``<key>.<ext>`` files in a tar.

    A sample's image is its member with an image extension (``jpg``, ``png``, ``webp``, ...),
    its label the integer text of its ``.cls`` member (``label_ext``). The shards' headers are
    read once (with the standard ``tarfile`` module) to find every image's byte range; DALI
    decodes the images::

        root/
          shard-000000.tar     # read in name order
            000000.png
            000000.cls         # "7"
            000001.png
            000001.cls
            ...
          shard-000001.tar

    Members are addressed one by one, so this source is index-driven (same batches whatever
    the number of devices; ``validation_split`` works). So every member must be a plain file,
    stored whole where its header says: a sparse member, a hard or symbolic link, a device
    node or a FIFO is refused by name (directories, and the PAX and GNU long-name headers that
    ``tarfile`` and ``webdataset`` write, are read as usual). A shard rewritten since its
    headers were read is refused by name.

    Args:
        path: a ``.tar`` shard or a directory of them.
        label_ext: the extension of the label members.
        **settings: the image settings, :class:`~easyfit.data.ImageFolder`'s keyword arguments
            (``image_size``, ``augment``, ``normalize``, ...: ``easyfit.data.images.ImageOptions``).

    Example:
        >>> import easyfit as ef
        >>> train = ef.data.WebDataset(MNIST_FORMATS["webdataset"] + "/train")
        >>> len(train), train.image_shape, len(train.files)
        (200, (28, 28, 1), 2)
    """

    def __init__(
        self,
        path: str | os.PathLike,
        label_ext: str = "cls",
        **settings: Unpack[ImageOptions],
    ):
        root = os.fspath(path)
        self.label_ext = label_ext
        self.files = list_files(root, (".tar",), "WebDataset (.tar)")
        self._stamp_files("members' byte ranges and labels")
        parts, labels, self.keys = [], [], []
        for k, shard in enumerate(self.files):
            ranges, shard_labels, keys = _scan(shard, label_ext)
            spans = np.asarray(ranges, np.int64).reshape(-1, 2)
            parts.append((np.full(len(spans), k, np.int32), spans[:, 0], spans[:, 1]))
            labels += shard_labels
            self.keys += keys
        self._set_ranges(parts)
        labels_read = int32_labels(np.asarray(labels, np.float64), self.locate)  # float64: any int
        RecordFiles.__init__(self, root, labels_read, ImageSettings.of("WebDataset", settings))

    def parse(self, index: int, raw: bytes) -> tuple[bytes, Any]:
        return raw, None

    def locate(self, index: int) -> str:
        return f"{self.files[int(self._file[index])]}: {self.keys[index]}"

    def settings(self) -> dict[str, Any]:
        return {**self.image_settings(), "label_ext": self.label_ext}

    def describe(self) -> str:
        return f"WebDataset({self.root!r}: {self.num_samples} samples in {len(self.files)} shards)"


register(Format("webdataset", WebDataset, holding(".tar"), suffixes=(".tar",), object_storage=True))
