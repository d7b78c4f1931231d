"""Every bad file or record of a data path in one run: ``easyfit check PATH`` and :func:`check`.

``fit`` checks each sample on the host the first time it feeds it, and stops at the first bad
one (a :class:`~easyfit.errors.DataError` naming it): two bad files cost three runs. This runs
the same host checks (``easyfit.data.validation``: readable, not empty, a whole image of a
known kind, a mask of its image's size...) over every sample up front, in parallel, and lists
all that fail:

* sources of one file per sample (image folders, image CSVs, segmentation folders): the
  source's named check in checker child processes (``check_pool.CheckPool``), one request of
  many samples per child; objects in a bucket (``s3://``) by concurrent GETs;
* records (TFRecord, RecordIO, WebDataset, Parquet rows): each record read and parsed here
  (a record that cannot be read or parsed is listed), its image checked whole in checker
  children (``check_pool.image_problems``) while the next records are read;
* other indexed sources (``.npy`` folders): the source's ``sample_problem``, in threads;
* a reader-driven source (Caffe2 LMDB): read in order by DALI, which stops at the first bad
  record (:func:`~easyfit.data.diagnose.scan_for_bad_record`).

Sources are built as ``fit`` builds them, but for what they sample up front: the image
settings are given (so no image is sampled), and records or ``.npy`` headers sampled as the
source is built are left out of the sample when bad (``strict_sample``), listed with the
others. Only what the host checks find is listed: an image whose structure is whole but that
DALI still cannot decode is named by ``fit`` when it reaches it.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, Protocol, cast, runtime_checkable

import numpy as np

from ..errors import DataError
from .check_pool import CheckPool, default_children, image_problems
from .diagnose import scan_for_bad_record
from .images import EncodedImages
from .resolve import detect, split_layout
from .sources.base import IndexedSource, ReaderSource, Source
from .sources.capabilities import EncodedSamples, FileBacked, RecordsLayout, SampleChecks
from .sources.folder import Files
from .sources.numpy_folder import NumpyFolder
from .sources.records import RecordFiles
from .storage import storage_of

__all__ = ["FIX", "Checked", "check", "checked_sources"]

#: What to do about the problems found, for the command's summary.
FIX = (
    "Remove or replace these files (an image folder can leave them out instead: "
    "ImageFolder(..., is_valid_file=...)), then run easyfit check again."
)

_CHUNK = 4096  # samples per request of the checks (per child: records' images)


def check(data: str | os.PathLike | Source, *, children: int | None = None) -> list[str]:
    """Every bad file or record of ``data``, found in one run: ``"<file or record>: <what is
    wrong>"`` each, in the order of the samples; empty when all are fine.

    ``data`` is what ``fit`` takes: a folder or file of any format easyfit reads (a root
    holding ``train/`` and ``val/`` is checked whole), an ``s3://`` prefix, or a source. The
    checks are ``fit``'s host checks of each sample, run in ``children`` checker processes
    (default: half the cores, 1 to 8). A path that cannot be read as data at all gives the
    one line that says why.

    Example:
        >>> import tempfile, easyfit as ef
        >>> root = ef.datasets.sample_folder(tempfile.mkdtemp() + "/check", limit=(20, 10))
        >>> with open(root + "/train/3/bad.png", "wb") as f:
        ...     _ = f.write(b"not an image")
        >>> for problem in ef.data.check(root):  # train/ and val/
        ...     print(problem.removeprefix(root))
        /train/3/bad.png: not an image (starts with b'not an i')
    """
    return [problem for checked in checked_sources(data, children=children) for problem in checked.problems]


class Checked(NamedTuple):
    """What :func:`checked_sources` found of one source."""

    what: str  #: the source's description, or the path that could not be read as data
    problems: list[str]  #: one line per bad sample (or, where not ``read``, why)
    read: bool = True  #: whether the path could be read as data at all


def checked_sources(data: str | os.PathLike | Source, *, children: int | None = None) -> Iterator[Checked]:
    """What :func:`check` finds, one source at a time (a root's ``train/`` and ``val/``: one
    each)."""
    if isinstance(data, Source):
        yield Checked(data.describe(), source_problems(data, children=children))
        return
    path = os.fspath(data)
    layout = split_layout(path)
    for part in [p for p in layout if p] if layout else [path]:
        try:
            source = _source(part)
        except DataError as e:
            yield Checked(part, [str(e)], read=False)
            continue
        try:
            yield Checked(source.describe(), source_problems(source, children=children))
        finally:
            source.close()


def _source(path: str) -> Source:
    """The source ``fit`` reads ``path`` as, built so that a bad sample stops nothing: the
    image settings given (a source infers them from a sample of its images, and stops at the
    first bad one), bad records or headers left out of its sample."""
    kind = detect(path)
    if issubclass(kind, (RecordFiles, NumpyFolder)):
        kind = type(kind.__name__, (kind,), {"strict_sample": False})
    if issubclass(kind, EncodedImages):
        return cast("Callable[..., Source]", kind)(path, image_size=(32, 32), color_mode="rgb")
    return cast("Callable[..., Source]", kind)(path)


def source_problems(source: Source, *, children: int | None = None) -> list[str]:
    """The problems of every sample of ``source`` (see the module's docstring)."""
    if isinstance(source, ReaderSource):
        found = scan_for_bad_record(source)
        return [found] if found else []
    assert isinstance(source, IndexedSource)
    n = source.num_samples
    if isinstance(source, Files) and source._check_name() is not None:
        pool = CheckPool(source._tables, source._check_name(), children)
        try:
            bad: dict[int, str] = {}
            for start in range(0, n, _CHUNK * max(1, pool.children)):
                part = np.arange(start, min(n, start + _CHUNK * max(1, pool.children)))
                bad.update(pool.problems(part, source.sample_problem))
        finally:
            pool.close()
    elif isinstance(source, _Records):
        bad = _record_problems(source, children)
    elif isinstance(source, SampleChecks):
        workers = max(1, default_children() if children is None else children)  # threads here
        with concurrent.futures.ThreadPoolExecutor(workers, "easyfit-check") as threads:
            problems = threads.map(_problem_of(source), range(n), chunksize=256)
            bad = {i: p for i, p in enumerate(problems) if p}
    else:
        bad = {}
    return [f"{source.locate(i)}: {bad[i]}" for i in sorted(bad)]


def _problem_of(source: SampleChecks):
    def problem(i: int) -> str | None:
        try:
            return source.sample_problem(i)
        except DataError as e:
            return str(e).removeprefix(f"{cast(IndexedSource, source).locate(i)}: ")

    return problem


@runtime_checkable
class _Records(RecordsLayout, EncodedSamples, SampleChecks, FileBacked, Protocol):
    """Encoded images in record files, indexed when the source was built: read here."""

    @property
    def num_samples(self) -> int: ...

    def locate(self, index: int) -> str: ...


def _record_problems(source: _Records, children: int | None) -> dict[int, str]:
    """Records read and parsed here (what cannot be is a problem), their images checked in
    checker children while the next ones are read."""
    unread: dict[int, str] = {}
    storage = storage_of(source.files)

    def image(i: int) -> bytes | str:
        try:
            data = source.encoded_image(i)
        except DataError as e:
            return str(e).removeprefix(f"{source.locate(i)}: ")
        if not data:  # nothing to send: the source's own word for it
            return source.sample_problem(i) or "no image"
        return data

    def chunks() -> Iterator[tuple[Sequence[int], Sequence[bytes]]]:
        for start in range(0, source.num_samples, _CHUNK):
            indices = range(start, min(source.num_samples, start + _CHUNK))
            read = storage.map(image, indices)  # a bucket's GETs: waited on together
            kept = [(i, r) for i, r in zip(indices, read, strict=True) if isinstance(r, bytes)]
            unread.update((i, r) for i, r in zip(indices, read, strict=True) if isinstance(r, str))
            yield [i for i, _ in kept], [r for _, r in kept]  # type: ignore[misc]

    found = image_problems(chunks(), children)
    return {**found, **unread}
