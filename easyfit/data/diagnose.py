"""Explaining a failed batch: which sample broke it, and why.

DALI reports a sample it cannot read or decode with a message that rarely names the file. When a
batch fails, the pipelines raise :func:`batch_error`, naming the culprit their kind finds. For an
indexed source, :func:`find_bad_sample` looks at the samples of the chunks DALI was working on:
each is checked on the host first (``IndexedSource.sample_problem``: unreadable, empty, broken
inside), then run alone through the source's own DALI graph on the CPU; the first that fails is
named. A reader-driven source is read again in order, one record at a time (:func:`scan_for_bad_record`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ..errors import DataError
from .images import first_line, turned
from .sources.base import IndexedSource, ReaderSource, Source, check_hint
from .sources.capabilities import EncodedSamples, SampleChecks

__all__ = [
    "batch_error",
    "find_bad_sample",
    "odd_shape_sample",
    "outside_error",
    "scan_for_bad_record",
    "turned_sample",
]


def batch_error(source: Source, error: RuntimeError, culprit: str | None) -> DataError:
    """A DataError for a batch DALI failed to produce: ``culprit`` (the bad sample and what is
    wrong with it, found by :func:`find_bad_sample` or :func:`scan_for_bad_record` as the
    source's kind reads it) when one was found, with the command that lists every bad one at
    once (``check_hint``), else DALI's own first line."""
    if culprit:
        return DataError(culprit + check_hint(source))
    return DataError(f"{source.describe()}: DALI failed to produce a batch: {first_line(error)}")


def find_bad_sample(source: IndexedSource, indices: Iterable[int]) -> str | None:
    """``"<file or record>: <what is wrong>"`` for the first bad sample among ``indices``.

    Example:
        >>> import numpy as np, easyfit as ef
        >>> from easyfit.data.diagnose import find_bad_sample
        >>> root = ef.datasets.sample_folder(DOCS_TMP + "/mnist", limit=(20, 10))
        >>> folder = ef.data.ImageFolder(root + "/train")
        >>> with open(folder.files[3], "r+b") as f:  # scramble the pixel data, keep the frame
        ...     _ = f.seek(50)
        ...     _ = f.write(bytes(range(40)))
        >>> find_bad_sample(folder, range(10)) == folder.files[3] + (": PNG chunk IDAT at byte 33 "
        ...                                                          "fails its CRC check")
        True
    """
    order = list(dict.fromkeys(int(i) for i in indices))
    if isinstance(source, SampleChecks):
        for i in order:
            problem = source.sample_problem(i)
            if problem:
                return f"{source.locate(i)}: {problem}"
    return _first_failing(source, order)


def _first_failing(source: IndexedSource, order: list[int]) -> str | None:
    for i, out in _alone(source, order):
        if isinstance(out, RuntimeError):
            return f"{source.locate(i)}: cannot be decoded or read ({first_line(out)})"
    return None


def outside_error(source: IndexedSource, suspects: Iterable[int], limit: int, batch: np.ndarray) -> DataError:
    """A DataError for a batch whose DALI-decoded labels (a mask's class ids) leave
    ``0..limit - 1``, naming the sample when one among ``suspects``, run alone, holds one."""
    fix = f"class ids must be in 0..{limit - 1} (255 often marks 'void' pixels: map it to a class)"
    order = list(dict.fromkeys(int(i) for i in suspects))
    ys = source.outputs.index("y")
    for i, out in _alone(source, order):
        if not isinstance(out, RuntimeError):
            y = np.asarray(out[ys].as_array())
            bad = y[(y < 0) | (y >= limit)]
            if bad.size:
                return DataError(
                    f"{source.locate(i)}: its label holds class id {int(bad[0])}, outside the "
                    f"model's {limit} outputs per pixel; {fix}"
                )
    value = int(batch[(batch < 0) | (batch >= limit)][0])
    return DataError(
        f"{source.describe()}: a label of a batch holds class id {value}, outside the model's "
        f"{limit} outputs per pixel; {fix}"
    )


def turned_sample(source: IndexedSource, suspects: Iterable[int]) -> str | None:
    """``"<file or record> is turned by its EXIF orientation ..."`` for the first sample among
    ``suspects`` whose encoded image an EXIF orientation turns by a quarter, else None: what
    explains decoded images with height and width swapped."""
    if not isinstance(source, EncodedSamples):
        return None
    for i in dict.fromkeys(int(i) for i in suspects):
        data = source.encoded_image(i)
        if data is not None and turned(data):
            return f"{source.locate(i)} is decoded{turned(data)}"
    return None


def odd_shape_sample(
    source: IndexedSource, suspects: Iterable[int], output: int, usual: tuple[int, ...]
) -> str | None:
    """``"<file or record> is decoded to shape (h, w, c)"`` for the first sample among
    ``suspects`` whose ``output`` (its index in ``source.outputs``), run alone, is not of the
    ``usual`` shape (one sample's), else None: what explains a batch whose samples differ in
    shape, or one of another shape than those before it (an image of another size that the
    images sampled at start-up did not show). A sample that fails alone is
    :func:`find_bad_sample`'s to name."""
    for i, out in _alone(source, list(dict.fromkeys(int(i) for i in suspects))):
        if not isinstance(out, RuntimeError):
            shape = tuple(int(d) for d in out[output].as_array().shape[1:])
            if shape != tuple(usual):
                return f"{source.locate(i)} is decoded to shape {shape}"
    return None


def _one_at_a_time(define: Callable[[], Any]) -> Callable[[], Any]:
    """``define`` as a DALI pipeline of one sample per run on the CPU, neither prefetched nor
    asynchronous, so that an error belongs to the sample just run."""
    from nvidia.dali import pipeline_def

    # DALI's pipeline_def stub types device_id as int; its docs take None (CPU only)
    return pipeline_def(  # type: ignore[call-overload]
        batch_size=1,
        num_threads=1,
        device_id=None,
        prefetch_queue_depth=1,
        exec_async=False,
        exec_pipelined=False,
    )(define)


def _alone(source: IndexedSource, order: list[int]) -> Iterator[tuple[int, Any]]:
    """``(index, outputs or the RuntimeError)`` of each sample of ``order`` run alone through
    the source's graph on the CPU (no augmentation)."""
    from nvidia.dali import fn

    if not order:
        return

    def one(info):
        return tuple(source.feed(np.array([order[min(info.iteration, len(order) - 1)]])))

    @_one_at_a_time
    def pipeline():
        nodes = fn.external_source(
            source=one,
            batch=True,
            batch_info=True,
            num_outputs=source.num_feeds,
            no_copy=source.feeds_shared,
        )
        return source.graph(*nodes, device="cpu")

    pipe = pipeline()
    try:
        pipe.build()
        for i in order:
            try:
                out: Any = pipe.run()
            except DataError:
                raise
            except RuntimeError as e:
                out = e
            yield i, out
    finally:
        del pipe


def scan_for_bad_record(source: ReaderSource, limit: int = 100_000) -> str | None:
    """Reads ``source`` in order, one record at a time, up to ``limit`` records; names the first
    one DALI cannot read or decode (``source.locate(position)``)."""

    @_one_at_a_time
    def pipeline():
        return source.read(shard_id=0, num_shards=1, shuffle=False, device="cpu")

    pipe = pipeline()
    try:
        pipe.build()
        for t in range(min(source.num_samples, limit)):
            try:
                pipe.run()
            except RuntimeError as e:
                return f"{source.locate(t)}: cannot be decoded or read ({first_line(e)})"
    except RuntimeError as e:
        return f"{source.describe()}: cannot be read ({first_line(e)})"
    finally:
        del pipe
    return None
