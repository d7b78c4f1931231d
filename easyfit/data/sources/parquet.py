"""Parquet shards of encoded images and labels (Hugging Face's layout), index-driven.

Parquet stores a column by *row groups*: a row is read by reading (and decompressing) the
column chunk of its row group. So row groups are read whole, with pyarrow (the GIL released),
ahead of the batches that need them, and kept in memory (a least-recently-used cache of row
groups bounded by ``cache_bytes``); DALI gets their encoded bytes as they are, no decoding in
Python (``easyfit.data.parquet_read``: the readers, the cache, the memory bound).
The order is easyfit's plan (a pure function of seed and pass), as for every index-driven
source; for images larger than the cache, a shuffled pass reads windows of row groups
(:meth:`Parquet.shuffle_windows`, ``easyfit.data.plan.Windows``), each row group once.

pyarrow is an optional dependency: ``pip install easyfit-flax[parquet]``.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import DataError
from ..images import EncodedImages, ImageOptions, ImageSettings, first_line, sample_positions
from ..parquet_read import WINDOWS_HELD, RowGroups, cut, damaged, is_local, open_file, problem, uncompressed
from ..parquet_read import pyarrow_parquet as _pyarrow
from ..plan import Windows
from ..storage import Entry, Listing, storage_for
from .base import IndexedSource, ReadAtStart, bad_sample, int32_labels, plain_names
from .folder import entries
from .registry import FILES, Format, holding, register

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Parquet", "hf_splits", "is_parquet_pattern", "splits_in"]

#: A Hugging Face shard's name: ``<split>-00000-of-00004[-<hash>].parquet`` (or ``<split>.parquet``,
#: for a split of :data:`_SPLIT_NAMES` only: ``shard0.parquet`` is a shard, not a split).
_HF_SHARD = re.compile(r"^(?P<split>[A-Za-z0-9_.]+?)(?P<of>-\d+-of-\d+(?:-[0-9a-f]+)?)?\.parquet$")
#: The names a file ``<split>.parquet`` is taken for a split by (as ``resolve.VALIDATION_NAMES``).
_SPLIT_NAMES = ("train", "val", "validation", "test", "testing")
#: Row groups read for the sample that infers the images' color mode and size.
_SAMPLED_GROUPS = 8
#: ``Parquet(shuffle=...)``'s values.
SHUFFLES = ("auto", "global", "row_groups")


def is_parquet_pattern(path: str) -> bool:
    """Whether ``path`` is a glob pattern of Parquet files (``"hf/data/train-*.parquet"``)."""
    return glob.has_magic(path) and path.lower().endswith(".parquet")


def _parquet_files(folder: str) -> list[str]:
    return sorted(e.path for e in entries(folder) if e.name.lower().endswith(".parquet"))


def hf_splits(root: str | os.PathLike | Listing) -> dict[str, str]:
    """The splits of a folder in Hugging Face's layout: ``{split: glob pattern}`` for the
    ``root/data/<split>-*.parquet`` shards (or ``root/<split>-*.parquet``); empty when ``root``
    holds no Parquet shards so named. A shard names its split by Hugging Face's
    ``<split>-00000-of-00004`` naming, or is ``<split>.parquet`` for a split named ``train``,
    ``val``, ``validation``, ``test`` or ``testing``; a folder of other names
    (``shard0.parquet``, ``shard1.parquet``) holds shards of one dataset. ``root`` may be its
    listing (``easyfit.data.storage.Listing``), made by the caller for its own questions.

    Example:
        >>> import os
        >>> from easyfit.data.sources.parquet import hf_splits
        >>> os.makedirs(DOCS_TMP + "/hf/data")
        >>> for name in ("train-00000-of-00002", "train-00001-of-00002", "validation-00000-of-00001"):
        ...     open(f"{DOCS_TMP}/hf/data/{name}.parquet", "wb").close()
        >>> sorted(hf_splits(DOCS_TMP + "/hf"))
        ['train', 'validation']
    """
    listing = root if isinstance(root, Listing) else storage_for(os.fspath(root)).listdir(os.fspath(root))
    if listing is None or listing.storage.remote:  # read from local files only: no splits there
        return {}
    return splits_in(*(f.with_suffix((".parquet",)) for f in (listing.child("data"), listing) if f))


def splits_in(*shards: list[Entry]) -> dict[str, str]:
    """:func:`hf_splits` from the Parquet files of a local root's ``data/`` folder and of the
    root (each the entries of a listing, sorted by name), which the caller listed: the splits
    of the first that holds shards named by split."""
    for files in shards:
        splits: dict[str, str] = {}
        for f in files:
            m = _HF_SHARD.match(f.name)
            if m is None or not (m["of"] or m["split"].lower() in _SPLIT_NAMES):
                return {}  # Parquet files, but not named by split: shards of one dataset
            split = m["split"]
            exact = f.name == f"{split}.parquet" and split not in splits
            splits[split] = f.path if exact else os.path.join(os.path.dirname(f.path), f"{split}-*.parquet")
        if splits:
            return splits
    return {}


def _resolve_files(path: str | os.PathLike | Sequence[str | os.PathLike]) -> tuple[str, list[str]]:
    """``(name, files)``: the Parquet files a path (a file, a folder, a glob pattern) or a list
    of them names, sorted (a list keeps its order)."""
    if not isinstance(path, (str, os.PathLike)):
        parts = [_resolve_files(p) for p in path]
        if not parts:
            raise DataError("Parquet: no paths given")
        return ", ".join(n for n, _ in parts), [f for _, fs in parts for f in fs]
    name = os.fspath(path)
    if glob.has_magic(name):
        files = sorted(f for f in glob.glob(name) if os.path.isfile(f))
        if not files:
            raise DataError(f"{name}: no Parquet files match")
        return name, files
    if os.path.isfile(name):
        return name, [name]
    if not os.path.isdir(name):
        raise DataError(f"{name}: no such file or directory")
    files = _parquet_files(name)
    if not files and os.path.isdir(os.path.join(name, "data")):
        files = _parquet_files(os.path.join(name, "data"))
    if not files:
        raise DataError(f"{name}: no Parquet files (.parquet), here or in data/")
    splits = hf_splits(name)
    if len(splits) > 1:
        raise DataError(
            f"{name}: holds the splits {', '.join(sorted(splits))} (Hugging Face's layout); "
            f"fit({name!r}) trains on 'train' and validates on the validation split; for one split "
            f"pass its pattern, e.g. {next(iter(splits.values()))!r}"
        )
    return name, files


def _hf_class_names(schema: Any, label: str) -> list[str] | None:
    """The class names of a Hugging Face ``ClassLabel`` column, from the schema's metadata."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    features = (meta.get("info") or {}).get("features") or meta.get("features") or {}
    feature = features.get(label) if isinstance(features, dict) else None
    if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" and feature.get("names"):
        return [str(n) for n in feature["names"]]
    return None


class Parquet(EncodedImages, IndexedSource):
    """Images in Parquet files: one column of encoded images, one of labels.

    Hugging Face's datasets are stored this way (``imagenet-1k``, ``mnist``, ...)::

        hf_dataset/
          data/
            train-00000-of-00004.parquet        read in name order
            ...
            validation-00000-of-00001.parquet

    ``fit("hf_dataset/")`` trains on the ``train`` shards and validates on ``validation`` (or
    ``val``, ``test``, ``testing``). The image column holds the encoded bytes (JPEG, PNG, ...),
    or Hugging Face's ``Image`` struct ``{"bytes": ..., "path": ...}`` with the bytes embedded;
    DALI decodes them. Labels are integers (class indices; a Hugging Face ``ClassLabel``'s
    names, stored in the schema's metadata, become ``class_names``) or strings (class names,
    sorted as image folders' are, unless ``class_names`` gives them).

    The labels are read when the source is built; the images a row group at a time as batches
    need them, kept in memory up to ``cache_bytes``. A file rewritten since the labels were read
    (its size or modification time changed) is refused by name when a row group of it is read
    again: its rows may no longer be the rows those labels were read from.

    Rows are addressed one by one, so this source is index-driven (same batches whatever the
    number of devices; ``validation_split`` works). When the images fit ``cache_bytes``, a
    shuffled pass is what it is for every such source: a new permutation of all the rows.
    When they do not, a permutation of all the rows would need rows of dozens of row groups
    for every batch and read each row group again and again; so (``shuffle="auto"``) a
    shuffled pass permutes the row groups, cuts them into windows of a quarter as many as the
    cache holds (the window being fed and those the pipelines' next runs need, read ahead,
    stay cached together), and permutes the rows within each window: each row group is read
    once per pass, as with Keras' ``shuffle="batch"`` and petastorm's row-group shuffling.
    fit says so once, with the window's size. The order is still a function of (seed, pass),
    the same in every process, so resuming is exact.

    Args:
        path: a ``.parquet`` file, a folder of them (or of ``data/``), a glob pattern such as
            ``"hf_dataset/data/train-*.parquet"``, or a list of these.
        image: the image column.
        label: the label column.
        class_names: the classes in label order, when they must match another split's (string
            labels are looked up in them).
        cache_bytes: the most bytes of row groups kept in memory; default a quarter of the
            machine's memory.
        shuffle: how fit's ``shuffle=True`` orders a pass: ``"auto"``, windows of row groups
            only when the images do not fit ``cache_bytes``; ``"global"``, a permutation of all
            the rows every pass (row groups read again and again when they do not fit);
            ``"row_groups"``, windows of row groups always (of a quarter of the row groups
            ``cache_bytes`` holds).
        **settings: the image settings, :class:`~easyfit.data.ImageFolder`'s keyword arguments
            (``image_size``, ``augment``, ``normalize``, ...: ``easyfit.data.images.ImageOptions``).

    Example:
        >>> import easyfit as ef
        >>> train = ef.data.Parquet(MNIST_FORMATS["parquet"] + "/data/train-*.parquet")
        >>> len(train), train.image_shape, len(train.files)
        (200, (28, 28, 1), 2)
    """

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        image: str = "image",
        label: str = "label",
        class_names: Sequence[str] | None = None,
        *,
        cache_bytes: int | None = None,
        shuffle: str = "auto",
        **settings: Unpack[ImageOptions],
    ):
        if shuffle not in SHUFFLES:
            raise ValueError(
                f"ef.data.Parquet(shuffle={shuffle!r}): expected one of {', '.join(map(repr, SHUFFLES))}"
            )
        self.shuffle = shuffle
        pq = _pyarrow()
        self.root, self.files = _resolve_files(path)
        self.image_column, self.label_column = image, label
        self.cache_bytes = int(cache_bytes) if cache_bytes is not None else _default_cache()
        sizes: list[np.ndarray] = []  # rows per row group, per file
        labels: list[np.ndarray] = []
        kinds: set[str] = set()
        hf_names: list[str] | None = None
        group_bytes: list[np.ndarray] = []  # each row group's images' bytes, uncompressed
        self._read_at_start = ReadAtStart(self.files, "labels and row groups")
        maps: list[bool] = []  # read through a memory map: local and stored uncompressed
        for f in self.files:
            pf = self._open(pq, f)
            try:
                schema = pf.schema_arrow
                self._check_columns(f, schema)
                meta = pf.metadata
                maps.append(is_local(f) and uncompressed(meta, image))
                sizes.append(
                    np.asarray([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], np.int64)
                )
                group_bytes.append(_column_bytes(meta, image))
                values, kind = self._read_labels(pf, f, sizes[-1])
            finally:
                pf.close()
            kinds.add(kind)
            labels.append(values)
            names = _hf_class_names(schema, label)
            if names is not None:
                if hf_names is not None and names != hf_names:
                    raise DataError(f"{f}: its ClassLabel names differ from those of {self.files[0]}")
                hf_names = names
        if len(kinds) > 1:
            raise DataError(f"{self.root}: column {label!r} holds integers in some files, strings in others")
        counts = np.concatenate(sizes)
        self._group_bytes = np.concatenate(group_bytes)
        self.image_bytes = int(self._group_bytes.sum())  # what caching them all takes
        self._file_of = np.concatenate([np.full(len(s), k, np.int32) for k, s in enumerate(sizes)])
        self._local = np.concatenate([np.arange(len(s)) for s in sizes])  # row group in its file
        self._start = np.concatenate([[0], np.cumsum(counts)])  # first row of each row group
        self._file_row = np.concatenate([np.concatenate([[0], np.cumsum(s)[:-1]]) for s in sizes])
        n = int(self._start[-1])
        if n == 0:
            raise DataError(f"{self.root}: no rows")
        every = np.concatenate(labels)
        if kinds == {"str"}:
            found, inverse = np.unique(every, return_inverse=True)  # sorted, as class folders
            self.class_names = [str(v) for v in found] if class_names is None else plain_names(class_names)
            lookup = {name: i for i, name in enumerate(self.class_names)}
            unknown = [v for v in found.tolist() if v not in lookup]
            if unknown:
                row = int(np.flatnonzero(every == unknown[0])[0])
                raise DataError(
                    f"{self.locate(row)}: class {unknown[0]!r} is not one of the training classes"
                )
            self._labels = np.asarray([lookup[v] for v in found.tolist()], np.int32)[inverse.reshape(-1)]
        else:
            self._labels = int32_labels(every, self.locate)
            names = hf_names if class_names is None else plain_names(class_names)
            if hf_names is not None and class_names is not None and hf_names != list(class_names):
                raise DataError(f"{self.root}: its ClassLabel names differ from the training data's")
            self.class_names = names
            if names is not None:
                bad = np.flatnonzero((self._labels < 0) | (self._labels >= len(names)))
                if len(bad):
                    row = int(bad[0])
                    named_by = "its ClassLabel names" if class_names is None else "of class_names"
                    raise DataError(
                        f"{self.locate(row)}: label {int(self._labels[row])} is not one of the "
                        f"{len(names)} classes {named_by} (a split published without labels, "
                        "such as a Hugging Face test split, holds -1)"
                    )
        self._groups = RowGroups(
            self.files,
            image,
            file_of=self._file_of,
            local=self._local,
            start=self._start,
            file_row=self._file_row,
            cache_bytes=self.cache_bytes,
            stamp=self._read_at_start.check,
            bad=lambda i, why: bad_sample(self, i, why),
            memory_map=maps,
            describe=self.describe,
            image_bytes=self.image_bytes,
            group_bytes=self._group_bytes,
        )
        EncodedImages.__init__(self, ImageSettings.of("Parquet", settings), self._sample, self.root)

    # ------------------------------------------------------------------------------ indexing
    def _open(self, pq: Any, f: str) -> Any:
        return open_file(f)

    def _check_columns(self, f: str, schema: Any) -> None:
        import pyarrow as pa

        names = schema.names
        for what, column in (("image", self.image_column), ("label", self.label_column)):
            if column not in names:
                raise DataError(
                    f"{f}: no column {column!r} (its columns: {', '.join(names)}); pass "
                    f"ef.data.Parquet(path, {what}=<the {what} column>)"
                )
        kind = schema.field(self.image_column).type
        if pa.types.is_struct(kind):
            if kind.get_field_index("bytes") < 0:
                raise DataError(
                    f"{f}: column {self.image_column!r} is a struct without a 'bytes' field "
                    "(Hugging Face's Image struct holds {'bytes': ..., 'path': ...})"
                )
            kind = kind.field("bytes").type
        if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind)):
            raise DataError(
                f"{f}: column {self.image_column!r} holds {kind}, not encoded images (binary, or "
                "Hugging Face's Image struct)"
            )

    def _read_labels(self, pf: Any, f: str, sizes: np.ndarray) -> tuple[np.ndarray, str]:
        """The label column of file ``f``, and whether it holds integers or strings."""
        import pyarrow as pa
        import pyarrow.compute as pc

        try:
            column = pf.read(columns=[self.label_column]).column(0)
        except Exception as whole:  # noqa: BLE001 - find the row group that cannot be read
            for g in range(len(sizes)):
                try:
                    pf.read_row_group(g, columns=[self.label_column])
                except Exception as e:  # noqa: BLE001 - pyarrow's errors
                    raise DataError(self._damaged(f, g, int(sizes[:g].sum()), int(sizes[g]), e)) from None
            raise DataError(
                f"{f}: column {self.label_column!r} cannot be read ({first_line(whole)}); the file "
                "is damaged or truncated: write it again"
            ) from None
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if column.null_count:
            row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise DataError(
                f"{self._locate_in(f, sizes, row)}: no label (null in column {self.label_column!r})"
            )
        kind = column.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
            return np.asarray(column.to_pylist(), object), "str"
        if pa.types.is_integer(kind) or pa.types.is_floating(kind):
            return pc.cast(column, pa.float64()).to_numpy(), "int"  # float64: any int, checked after
        raise DataError(f"{f}: column {self.label_column!r} holds {kind}, not integer or string labels")

    def _locate_in(self, f: str, sizes: np.ndarray, row: int) -> str:
        g = int(np.searchsorted(np.cumsum(sizes), row, side="right"))
        return f"{f}: row group {g}, row {row}"

    @staticmethod
    def _damaged(f: str, g: int, first: int, rows: int, e: BaseException) -> str:
        return damaged(f, g, first, rows, e)

    def _row(self, index: int) -> tuple[int, int]:
        g = int(np.searchsorted(self._start, index, side="right") - 1)
        return g, index - int(self._start[g])

    def _sample(self) -> list[tuple[str, bytes]]:
        """Up to 64 images from up to :data:`_SAMPLED_GROUPS` row groups spread over the data."""
        groups = sample_positions(len(self._local), _SAMPLED_GROUPS)
        per = max(1, 64 // len(groups))
        out = []
        for g in groups.tolist():
            rows = int(self._start[g + 1] - self._start[g])
            for r in sample_positions(rows, per).tolist():
                index = int(self._start[g]) + r
                out.append((self.locate(index), self._image(index).tobytes()))
        return out

    # ------------------------------------------------------------------------------ feeding
    @property
    def num_samples(self) -> int:
        return int(self._start[-1])

    @property
    def num_feeds(self) -> int:
        return 4

    #: feed hands DALI the cached row groups' own buffers (``parquet_read.RowGroups.gather``)
    feeds_shared = True

    def known_labels(self) -> np.ndarray:
        return self._labels

    def records_layout(self) -> tuple[np.ndarray, ...]:
        """What was read of the files: each row group's file and rows, each row's label; a
        resumed fit's data fingerprint compares it with the backup's."""
        return (self._file_of, self._start, self._labels)

    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        indices = np.asarray(indices, np.int64)
        return (*self._groups.gather(indices), self._labels[indices])

    def shuffle_windows(self) -> Windows | None:
        """The windows of row groups a shuffled pass reads (see the class), or None for a
        permutation of all the rows (``shuffle="global"``, or ``"auto"`` and the images fit
        ``cache_bytes``)."""
        fits = self.image_bytes <= self.cache_bytes
        if self.shuffle == "global" or (self.shuffle == "auto" and fits):
            return None
        groups = len(self._local)
        held = self.cache_bytes // max(1, int(self._group_bytes.max()))  # the largest: the bound
        size = max(1, min(groups, held // WINDOWS_HELD))
        rows = round(self.num_samples / groups * size)
        why = (
            f"shuffle={self.shuffle!r}"
            if fits
            else f"its images ({_mib(self.image_bytes)}) do not fit cache_bytes ({_mib(self.cache_bytes)})"
        )
        note = (
            f"{self.describe()}: {why}: a shuffled pass permutes its {groups} row groups and the "
            f"rows within windows of {size} row groups (about {rows} rows), reading each row group "
            "once per pass. For a permutation of all the rows every pass, give "
            f"ef.data.Parquet(..., cache_bytes={self.image_bytes}) or more"
        )
        block_of = np.repeat(np.arange(groups), np.diff(self._start))
        return Windows(block_of, size, note)

    def prepare(self, indices: np.ndarray) -> None:
        """Starts reading the row groups of the next runs' rows (``parquet_read``'s readers)."""
        self._groups.ahead(indices)

    def close(self) -> None:
        """Stops the readers and lets the cached row groups go (read again when needed)."""
        groups = getattr(self, "_groups", None)
        if groups is not None:  # None: the constructor failed
            groups.close()

    def graph(self, *nodes: Any, device: str, draws: dict[str, Any] | None = None) -> tuple[Any, Any]:
        encoded, offsets, lengths, labels = nodes  # as feed() returns them
        images = self.decode(cut(encoded, offsets, lengths), device=device, draws=draws)
        return images, (labels.gpu() if device == "gpu" else labels)

    def limit_labels(self, num_classes: int) -> None:
        """Known labels are checked whole before training: nothing to do."""

    def _image(self, index: int) -> np.ndarray:
        return self._groups.image(index)

    def encoded_image(self, index: int) -> bytes | None:
        return self._image(index).tobytes()

    def sample_problem(self, index: int) -> str | None:
        return problem(self._image(index))

    def locate(self, index: int) -> str:
        g, _ = self._row(index)
        f = self.files[int(self._file_of[g])]
        row = int(self._file_row[g]) + index - int(self._start[g])  # in its file
        return f"{f}: row group {int(self._local[g])}, row {row}"

    # ------------------------------------------------------------------------------ splits
    def settings(self) -> dict[str, Any]:
        """Constructor arguments that give another split the same samples' form."""
        return {
            **self.image_settings(),
            "image": self.image_column,
            "label": self.label_column,
            "class_names": self.class_names,
            "cache_bytes": self.cache_bytes,
            "shuffle": self.shuffle,
        }

    def sibling(self, path: str | os.PathLike) -> Parquet | None:
        other = Parquet(path, **self.settings())  # a DataError here is the split's own: raised
        self.check_same_images(other, self.root, other.root)
        return other

    def recipe(self) -> dict[str, Any]:
        return {**super().recipe(), "columns": {"image": self.image_column, "label": self.label_column}}

    @classmethod
    def from_recipe(cls, path: str | os.PathLike, recipe: Mapping[str, Any]) -> Parquet:
        columns = recipe.get("columns") or {}
        return cls(
            path,
            **{k: v for k, v in columns.items() if k in ("image", "label")},
            class_names=recipe.get("class_names"),
            **cls.recipe_settings(recipe),
        )

    def describe(self) -> str:
        return f"Parquet({self.root!r}: {self.num_samples} rows in {len(self.files)} files)"


def _column_bytes(meta: Any, column: str) -> np.ndarray:
    """Uncompressed bytes of ``column`` (and its struct's fields) in each row group."""
    total = np.zeros(meta.num_row_groups, np.int64)
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        for c in range(rg.num_columns):
            chunk = rg.column(c)
            path = chunk.path_in_schema
            if path == column or path.startswith(column + "."):
                total[g] += int(chunk.total_uncompressed_size)
    return total


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _default_cache() -> int:
    """A quarter of the machine's memory."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError):
        return 4 << 30


def _hf_layout(listing: Listing) -> bool:
    """Whether a folder is in Hugging Face's layout: Parquet files in its ``data/``."""
    data = listing.child("data")
    return data is not None and bool(data.with_suffix((".parquet",)))


register(Format("parquet", Parquet, holding(".parquet"), suffixes=(".parquet",), pattern=is_parquet_pattern))
register(Format("parquet-hf", Parquet, _hf_layout, priority=FILES + 10))
