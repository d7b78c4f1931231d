"""The reading machinery of :class:`~easyfit.data.sources.parquet.Parquet`: row groups of the
image column read ahead by a few reader threads, kept in a least-recently-used cache, and each
batch's images handed to DALI without Python work per image.

The host's costs it keeps off the feeding threads: a row group read and decompressed in the
thread that feeds a pipeline, when a batch first needs it (a shuffled first pass needs nearly
every row group for its first batch), and Python work per image to cut its bytes out of the
row group and for DALI's ``external_source`` to wrap and copy them. So:

- reads run in :func:`readers` threads (pyarrow lets go of the interpreter lock while it
  reads and decompresses), started ahead by :meth:`RowGroups.ahead` with the row groups the
  pipelines' next runs need (at most ``readers x AHEAD`` reads at a time), and by a batch that
  needs several row groups not in memory, all at once;
- a local shard whose image column is stored uncompressed is read through a memory map;
- :meth:`RowGroups.gather` hands DALI one buffer per sample, shared by many samples, and each
  image's offset and length in it; the pipeline's ``external_source`` takes the buffers
  without a copy (``IndexedSource.feeds_shared``) and :func:`cut` slices each image out in
  DALI's threads. The buffers are the cached row groups themselves when the images fit
  ``cache_bytes``; else one copy of the batch's images (Arrow's ``take``, native code), so
  that a batch in DALI's queue holds only its own bytes.

Host memory: the cached row groups (at most ``cache_bytes``, or one row group when a single
one is larger), plus the row groups being read (at most ``readers x AHEAD`` ahead of need,
and those a batch waits for), plus the batches DALI holds (each the size of its images, or
the cached row groups it shares).

The bytes are never changed: every sample is the bytes of its row, as the file holds them.
Each image's structure is checked once, when its row group is first read, and an image found
bad raises (naming file, row group and row) when a batch asks for it.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._env import available_cores
from ..errors import DataError
from .images import first_line
from .validation.encoded import HEAD, TAIL, WHOLE, encoded_problem

__all__ = ["AHEAD", "WINDOWS_HELD", "RowGroups", "cut", "fed_images", "readers"]

#: Row groups each reader may read ahead of the feeds: with :func:`readers` threads, at most
#: ``readers() * AHEAD`` row groups beyond the cache are held.
AHEAD = 2

#: A shuffled pass of row groups larger than the cache reads them in windows of
#: ``1 / WINDOWS_HELD`` of the row groups the cache holds: the window being fed, and those
#: the pipelines' next runs need (several pipelines feed parts of a chunk at once, and the
#: readers read ahead), stay cached together, so that each row group is read once per pass.
WINDOWS_HELD = 4


def readers() -> int:
    """Reader threads per source: about one per pipeline that feeds it (a GPU machine runs up
    to three per device, each on four cores or more): ``cores // 4``, 1 to 4."""
    return max(1, min(4, available_cores() // 4))


def pyarrow_parquet() -> Any:
    """The ``pyarrow.parquet`` module; ImportError naming the extra that installs it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            "reading Parquet needs pyarrow: pip install 'easyfit-flax[parquet]' (or pip install pyarrow)"
        ) from None
    return pq


def open_file(f: str, memory_map: bool = False) -> Any:
    """``pyarrow.parquet.ParquetFile(f)``, its pages' checksums verified; DataError naming ``f``."""
    pq = pyarrow_parquet()
    try:
        return pq.ParquetFile(f, page_checksum_verification=True, memory_map=memory_map)
    except OSError as e:
        raise DataError(f"{f}: cannot be read ({e.strerror or e})") from None
    except Exception as e:  # noqa: BLE001 - pyarrow's ArrowInvalid and kin
        raise DataError(
            f"{f}: not a readable Parquet file ({first_line(e)}); it may be truncated or damaged"
        ) from None


def damaged(f: str, g: int, first: int, rows: int, e: BaseException) -> str:
    """The message for row group ``g`` of ``f`` (rows ``first``...) that cannot be read."""
    return (
        f"{f}: row group {g} (rows {first}-{first + rows - 1}) cannot be read "
        f"({first_line(e)}); the file is damaged or truncated: write it again"
    )


def problem(image: np.ndarray) -> str | None:
    """:func:`~easyfit.data.validation.encoded.encoded_problem` of an image held as a NumPy view
    (its whole structure when it is at most :data:`~easyfit.data.validation.encoded.WHOLE` bytes)."""
    size = len(image)
    if size == 0:
        return "empty image (0 bytes)"
    data = image.tobytes() if size <= WHOLE else None
    return encoded_problem(image[:HEAD].tobytes(), image[-TAIL:].tobytes(), size, data)


def uncompressed(meta: Any, column: str) -> bool:
    """Whether every chunk of ``column`` (and its struct's fields) is stored uncompressed."""
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        for c in range(rg.num_columns):
            chunk = rg.column(c)
            path = chunk.path_in_schema
            if (path == column or path.startswith(column + ".")) and chunk.compression != "UNCOMPRESSED":
                return False
    return True


class RowGroups:
    """The image column of Parquet shards, a row group at a time: read ahead by a pool of
    readers, kept in memory up to ``cache_bytes`` (least recently used dropped first), each
    image checked once.

    Host memory is bounded by ``cache_bytes`` (or one row group, when one is larger), plus the
    row groups being read (at most ``readers x AHEAD`` ahead of need, and those a batch waits
    for), plus the batches DALI holds.

    Args:
        files: the shards.
        column: the image column (binary, or Hugging Face's Image struct).
        file_of: per row group, its file.
        local: per row group, its index in its file.
        start: per row group, its first row in the dataset (one more entry: the number of rows).
        file_row: per row group, its first row in its file.
        cache_bytes: the most bytes of row groups kept.
        stamp: raises DataError when file ``f`` changed since the labels were read.
        bad: the DataError for dataset row ``i`` whose image has the given problem.
        memory_map: per file, read it through a memory map (local, stored uncompressed).
        describe: the source's name, for the warning.
        image_bytes: the images' bytes, uncompressed, for the warning.
        group_bytes: per row group, its images' bytes as the file's metadata says (uncompressed):
            the cache counts a row group as this or its array's bytes, the larger, so that the
            row groups a window of a shuffled pass holds (counted from the metadata) fit.
    """

    def __init__(
        self,
        files: Sequence[str],
        column: str,
        *,
        file_of: np.ndarray,
        local: np.ndarray,
        start: np.ndarray,
        file_row: np.ndarray,
        cache_bytes: int,
        stamp: Callable[[int], None],
        bad: Callable[[int, str], Exception],
        memory_map: Sequence[bool],
        describe: Callable[[], str],
        image_bytes: int,
        group_bytes: np.ndarray | None = None,
    ):
        self.files, self.column = list(files), column
        self.file_of, self.local, self.start, self.file_row = file_of, local, start, file_row
        self.cache_bytes = cache_bytes
        self._stamp, self._bad_error, self._memory_map = stamp, bad, list(memory_map)
        self._describe, self._image_bytes = describe, image_bytes
        self._group_bytes = np.zeros(len(local), np.int64) if group_bytes is None else group_bytes
        count = len(local)
        self._arrays = np.full(count, None, object)  # the cached row groups' Arrow arrays...
        self._tensors = np.full(count, None, object)  # ...and their bytes as DALI TensorCPUs
        self._offsets = np.zeros(int(start[-1]), np.int64)  # each row's image in its row group
        self._lengths = np.zeros(int(start[-1]), np.int64)
        self._nbytes = np.zeros(count, np.int64)
        self._used = np.zeros(count, np.int64)  # when each was last asked for (a tick)
        self._tick = 0
        self._cached_bytes = 0
        self._loading: dict[int, concurrent.futures.Future] = {}  # reads under way, or ahead
        self._checked = np.zeros(count, bool)  # the row group's images checked (once)
        self._bad = np.zeros(int(start[-1]), bool)
        self._problems: dict[int, str] = {}
        self._lock = threading.Lock()
        self._readers = readers()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._rows_read = 0  # rows of the row groups read from the files...
        self._rows_fed = 0  # ...and rows fed: a pass in file order reads each row once
        #: how many times each row group was read from its file (a pass over rows that fit
        #: the cache, or a windowed one, reads each once)
        self.reads = np.zeros(count, np.int64)
        self._warned = False

    # ------------------------------------------------------------------------------ reading
    def group_of(self, indices: np.ndarray) -> np.ndarray:
        """The row group of each dataset row."""
        return np.searchsorted(self.start, indices, side="right") - 1

    def read(self, g: int) -> Any:
        """Row group ``g``'s image column as one Arrow binary array (the struct's ``bytes``
        field), from its file; DataError naming file, row group and rows."""
        import pyarrow as pa

        f, local = int(self.file_of[g]), int(self.local[g])
        path = self.files[f]
        rows = int(self.start[g + 1] - self.start[g])
        pf = open_file(path, self._memory_map[f])
        with self._lock:
            self.reads[g] += 1
        try:
            self._stamp(f)  # the file opened is the one labels were read from, or refused
            try:
                chunks = pf.read_row_group(local, columns=[self.column], use_threads=False).column(0)
                column = chunks.chunk(0) if chunks.num_chunks == 1 else chunks.combine_chunks()
            except Exception as e:  # noqa: BLE001 - pyarrow's errors
                self._stamp(f)  # rewritten while it was read (read ahead): refused as changed
                raise DataError(damaged(path, local, int(self.file_row[g]), rows, e)) from None
        finally:
            pf.close()
        if len(column) != rows:
            raise DataError(damaged(path, local, int(self.file_row[g]), rows, ValueError("row count")))
        hint = ""
        parts = [column]
        if pa.types.is_struct(column.type):
            column = column.field("bytes")  # the struct's own nulls stay in parts[0]
            parts.append(column)
            hint = (
                "; a Hugging Face Image that names only its path must be stored with its bytes "
                "(datasets' embed_external_files)"
            )
        if any(p.null_count for p in parts):
            missing = np.logical_or.reduce([p.is_null().to_numpy(zero_copy_only=False) for p in parts])
            row = int(self.file_row[g]) + int(np.flatnonzero(missing)[0])
            raise DataError(
                f"{path}: row group {local}, row {row}: no image (null in column {self.column!r}){hint}"
            )
        if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
            column = column.cast(pa.large_binary())  # binary_view: another layout
        return column

    def _check(self, g: int, column: Any) -> None:
        """Checks row group ``g``'s images (the first time it is read)."""
        data, starts = _buffers(column)
        first = int(self.start[g])
        found = {}
        for r in range(len(column)):
            p = problem(data[starts[r] : starts[r + 1]])
            if p:
                found[first + r] = p
        with self._lock:
            for i, p in found.items():
                self._bad[i] = True
                self._problems[i] = p
            self._checked[g] = True

    def _load(self, g: int, check: bool = True) -> Any:
        """Reads row group ``g`` (in a reader, or in the thread that needs it), checks its
        images the first time (with ``check``), and caches it; its array."""
        column = self.read(g)
        if check and not self._checked[g]:
            self._check(g, column)
        from nvidia.dali.tensors import TensorCPU

        data, starts = _buffers(column)
        tensor = TensorCPU(data if len(data) else np.zeros(1, np.uint8))  # holds the buffer
        first, last = int(self.start[g]), int(self.start[g + 1])
        with self._lock:
            self._offsets[first:last] = starts[:-1]
            self._lengths[first:last] = np.diff(starts)
            self._keep(g, column, tensor)
        return column

    def _keep(self, g: int, column: Any, tensor: Any) -> None:
        """Caches row group ``g`` (the lock held), dropping the least recently used beyond
        ``cache_bytes`` (never ``g`` itself)."""
        if self._arrays[g] is None:
            self._arrays[g], self._tensors[g] = column, tensor
            self._nbytes[g] = max(int(column.nbytes), int(self._group_bytes[g]))
            self._cached_bytes += int(self._nbytes[g])
            self._rows_read += int(self.start[g + 1] - self.start[g])
        self._tick += 1
        self._used[g] = self._tick
        while self._cached_bytes > self.cache_bytes:
            held = np.flatnonzero(self._nbytes)
            held = held[held != g]
            if not len(held):
                break
            old = int(held[np.argmin(self._used[held])])
            self._arrays[old] = self._tensors[old] = None
            self._cached_bytes -= int(self._nbytes[old])
            self._nbytes[old] = 0

    def _future(self, g: int, ahead: bool) -> concurrent.futures.Future | None:
        """The read of row group ``g`` (the lock held): the one under way or waiting for a
        reader, else a new one, handed to a reader when ``ahead``. None when it is cached."""
        if self._arrays[g] is not None:
            return None
        future = self._loading.get(g)
        if future is not None:
            return future
        future = concurrent.futures.Future()
        self._loading[g] = future
        if ahead:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self._readers, "easyfit-parquet")
            self._pool.submit(self._run, g, future)
        return future

    def _run(self, g: int, future: concurrent.futures.Future, check: bool = True) -> None:
        """Runs the read of ``future`` unless another thread took it (or it was cancelled)."""
        with self._lock:  # one thread wins the read
            if future.running() or future.done() or not future.set_running_or_notify_cancel():
                return
        try:
            future.set_result(self._load(g, check))
        except BaseException as e:  # noqa: BLE001 - handed to the feed that needs the row group
            future.set_exception(e)
        finally:
            with self._lock:
                if self._loading.get(g) is future:
                    del self._loading[g]

    def array(self, g: int, check: bool = True) -> Any:
        """Row group ``g``'s image column: cached, read ahead, or read now (in this thread
        when no reader has started it; its images checked then with ``check``: a feed checks
        those of a row group read without, e.g. by ``easyfit check``, which checks them in
        its checker processes)."""
        while True:
            with self._lock:
                self._tick += 1
                self._used[g] = self._tick
                cached = self._arrays[g]
                future = None if cached is not None else self._future(g, ahead=False)
            if future is None:
                return cached
            self._run(g, future, check)  # a read not yet started: this thread's
            try:
                return future.result()
            except concurrent.futures.CancelledError:  # closed meanwhile: read it anew
                with self._lock:
                    if self._loading.get(g) is future:
                        del self._loading[g]

    def ahead(self, indices: np.ndarray) -> None:
        """Starts reading, in the readers and without waiting, the row groups that the rows
        ``indices`` (the next runs') need and that are neither cached nor being read, in the
        order they are needed: at most ``readers x AHEAD`` reads at a time."""
        groups = self.group_of(np.asarray(indices, np.int64))
        _, first = np.unique(groups, return_index=True)
        groups = groups[np.sort(first)]
        with self._lock:
            for g in groups[self._nbytes[groups] == 0].tolist():
                if len(self._loading) >= self._readers * AHEAD:
                    break
                self._future(g, ahead=True)

    # ------------------------------------------------------------------------------ feeding
    def gather(self, indices: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray]:
        """The images of dataset rows ``indices`` for DALI: ``(buffers, offsets, lengths)``, a
        TensorList of one buffer per sample (shared: the same buffer for many samples) and
        each image's offset and length in its buffer, ``(n, 1)`` int64, that :func:`cut`
        slices it out by. The buffers are the cached row groups themselves when the images
        fit ``cache_bytes`` (no copy, no Python per image); else one copy of the batch's
        images, so that a batch holds only its own bytes."""

        indices = np.asarray(indices, np.int64)
        groups = self.group_of(indices)
        with self._lock:
            self._tick += 1
            self._used[groups] = self._tick
            tensors = self._tensors[groups]
            missing = np.flatnonzero(self._nbytes[groups] == 0)  # not cached
            self._rows_fed += len(indices)
        shared = self._image_bytes <= self.cache_bytes
        if len(missing) or not shared:
            needed = np.unique(groups[missing] if shared else groups).tolist()
            with self._lock:  # those not cached read by the readers at once, this thread the first
                for g in needed[1:]:
                    self._future(g, ahead=True)
            arrays = {g: self.array(g) for g in needed}
        for g in np.unique(groups[~self._checked[groups]]).tolist():  # read unchecked (image())
            self._check(g, self.array(g))
        bad = self._bad[indices]
        if bad.any():
            i = int(indices[np.argmax(bad)])
            raise self._bad_error(i, self._problems[i])
        self._warn()
        if shared:
            for j in missing.tolist():  # read now: the arrays' own buffers
                tensors[j] = self._tensor(int(groups[j]), arrays[int(groups[j])])
            with self._lock:
                offsets, lengths = self._offsets[indices], self._lengths[indices]
            return (
                _shared(tensors.tolist()),
                offsets.reshape(-1, 1),
                lengths.reshape(-1, 1),
            )
        return self._compact(indices, groups, arrays)

    def _tensor(self, g: int, column: Any) -> Any:
        """The TensorCPU of row group ``g``'s buffer: the cached one, or one made now (it was
        dropped meanwhile)."""
        from nvidia.dali.tensors import TensorCPU

        with self._lock:
            tensor = self._tensors[g] if self._arrays[g] is column else None
        if tensor is None:
            data, _ = _buffers(column)
            tensor = TensorCPU(data if len(data) else np.zeros(1, np.uint8))
        return tensor

    def _compact(self, indices: np.ndarray, groups: np.ndarray, arrays: dict[int, Any]) -> tuple[Any, ...]:
        """:meth:`gather`'s result as one copy of the batch's images (Arrow's ``take`` per row
        group, then one concatenation), in row-group order."""
        import pyarrow as pa
        from nvidia.dali.tensors import TensorCPU

        order = np.argsort(groups, kind="stable")
        local = (indices - self.start[groups])[order]
        touched, counts = np.unique(groups[order], return_counts=True)
        ends = np.cumsum(counts)
        parts = []
        large = any(pa.types.is_large_binary(a.type) for a in arrays.values())
        for g, a, b in zip(touched.tolist(), (ends - counts).tolist(), ends.tolist(), strict=True):
            part = arrays[g].take(pa.array(local[a:b]))
            parts.append(part.cast(pa.large_binary()) if large else part)
        data, starts = _buffers(pa.concat_arrays(parts))
        at = np.empty(len(indices), np.int64)
        at[order] = np.arange(len(indices))
        tensor = TensorCPU(data if len(data) else np.zeros(1, np.uint8))
        return (
            _shared([tensor] * len(indices)),
            starts[at].reshape(-1, 1),
            (starts[at + 1] - starts[at]).reshape(-1, 1),
        )

    def _warn(self) -> None:
        """Warns once when row groups are read again and again."""
        with self._lock:
            warn = not self._warned and self._rows_read > 2 * self._rows_fed + len(self._bad)
            self._warned |= warn
        if warn:
            warnings.warn(
                f"{self._describe()}: row groups are read again and again: its images "
                f"({self._image_bytes / 2**20:.0f} MiB) do not fit cache_bytes "
                f"({self.cache_bytes / 2**20:.0f} MiB), and a shuffled pass of all the rows "
                "(shuffle='global') needs rows of many row groups at a time. Raise cache_bytes=, "
                "or leave ef.data.Parquet(shuffle='auto'), which shuffles windows of row groups "
                "that fit (see 'Parquet' in docs/data-formats.md)",
                UserWarning,
                stacklevel=4,
            )

    def image(self, index: int) -> np.ndarray:
        """The bytes of dataset row ``index`` (a view of its cached row group)."""
        g = int(self.group_of(np.asarray([index]))[0])
        data, starts = _buffers(self.array(g, check=False))
        r = index - int(self.start[g])
        return data[starts[r] : starts[r + 1]]

    def close(self) -> None:
        """Stops the readers (a later read starts them again) and lets the cache go."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for g, future in list(self._loading.items()):
                if future.cancel():  # not started: a later read starts anew
                    del self._loading[g]
            self._arrays[:] = None
            self._tensors[:] = None
            self._nbytes[:] = 0
            self._cached_bytes = 0


def _buffers(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(data, offsets)`` of an Arrow binary or large binary array: its bytes as stored (no
    copy) and its ``len + 1`` offsets (int64) into them."""
    import pyarrow as pa

    width = np.int64 if pa.types.is_large_binary(column.type) else np.int32
    _, offsets, data = column.buffers()
    starts = np.frombuffer(offsets, width)[column.offset : column.offset + len(column) + 1].astype(np.int64)
    images = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return images, starts


def _shared(tensors: list[Any]) -> Any:
    """A DALI TensorListCPU of ``tensors`` that shares their memory (no copy)."""
    from nvidia.dali.tensors import TensorListCPU

    # DALI's stub lacks the ``contiguous`` argument its binding takes
    return TensorListCPU(tensors, "", contiguous=False)  # type: ignore[call-overload]


def cut(encoded: Any, offsets: Any, lengths: Any) -> Any:
    """DALI graph: each sample's image, sliced out of the fed buffer at its offset and length."""
    from nvidia.dali import fn

    return fn.slice(encoded, offsets, lengths, axes=[0])


def fed_images(fed: Sequence[Any]) -> list[bytes]:
    """The images of what :meth:`RowGroups.gather` returned, as bytes (what DALI decodes)."""
    tensors, offsets, lengths = fed[:3]
    return [
        np.asarray(tensors[k])[int(o) : int(o) + int(n)].tobytes()
        for k, (o, n) in enumerate(zip(offsets.ravel(), lengths.ravel(), strict=True))
    ]


def is_local(path: str) -> bool:
    """Whether ``path`` is a file on this machine (a memory map can read it)."""
    return os.path.isfile(path)
