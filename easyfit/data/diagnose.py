"""Explaining a failed batch: which sample broke it, and why.

DALI reports a sample it cannot read or decode with a message that rarely names the file. When a
batch fails, the loader asks :func:`find_bad_sample` about the samples of the chunks DALI was
working on: each is checked on the host first (``Source.sample_problem``: unreadable, empty,
broken inside), then run alone through the source's own DALI graph on the CPU; the first that
fails is named.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..errors import DataError
from .base import Source
from .images import first_line

__all__ = ["find_bad_sample"]


def find_bad_sample(source: Source, indices: Iterable[int]) -> str | None:
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
    for i in order:
        problem = source.sample_problem(i)
        if problem:
            return f"{source.locate(i)}: {problem}"
    return _first_failing(source, order)


def _first_failing(source: Source, order: list[int]) -> str | None:
    from nvidia.dali import fn, pipeline_def

    if not order:
        return None

    def one(info):
        return tuple(source.feed(np.array([order[min(info.iteration, len(order) - 1)]])))

    # DALI's pipeline_def stub types device_id as int; its docs take None (CPU only)
    @pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1,  # type: ignore[call-overload]
                  exec_async=False, exec_pipelined=False)
    def pipeline():
        nodes = fn.external_source(source=one, batch=True, batch_info=True,
                                   num_outputs=source.num_feeds)
        return source.graph(*nodes, device="cpu")

    pipe = pipeline()
    try:
        pipe.build()
        for i in order:
            try:
                pipe.run()
            except DataError:
                raise
            except RuntimeError as e:
                return f"{source.locate(i)}: cannot be decoded or read ({first_line(e)})"
    finally:
        del pipe
    return None
