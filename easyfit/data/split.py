"""``validation_split``: a seeded, disjoint train/validation split of one source."""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from .loader import kind_of
from .sources.base import IndexedSource, Source, Subset
from .sources.capabilities import InMemory, base_of

__all__ = ["held_out", "split_validation"]


def held_out(source: Source, n: int, fraction: float) -> int:
    """How many of ``n`` samples ``validation_split=fraction`` holds out, as Keras counts:
    ``n - floor(n * (1 - fraction))`` for arrays (Keras' ``train_validation_split``), else
    ``int(n * fraction)`` (``image_dataset_from_directory``'s count of files)."""
    if isinstance(base_of(source), InMemory):  # one array, or a dict or tuple of them
        return n - math.floor(n * (1.0 - fraction))
    return int(n * fraction)


def split_validation(source: Source, fraction: float, seed: int = 0) -> tuple[Subset, Subset]:
    """``(train, validation)``: a seeded random ``fraction`` of ``source`` held out.

    The split depends only on the number of samples, ``fraction`` and ``seed``: the same on
    every run, in every process and whatever the number of devices. Each part keeps the
    source's order (the loader shuffles the training part every epoch). Its sizes are
    Keras': of ``n`` files, ``int(n * fraction)`` are held out (``image_dataset_from_directory``);
    of ``n`` array rows, ``n - floor(n * (1 - fraction))`` (``fit(validation_split=)``), so a
    tiny fraction of arrays still validates on one row. Refused only when a side is empty.

    Args:
        source: an index-driven source (any but a reader-driven one such as an LMDB).
        fraction: the share held out for validation, in (0, 1).
        seed: seeds the permutation.

    Example:
        >>> import numpy as np, easyfit as ef
        >>> from easyfit.data.split import split_validation
        >>> data = ef.data.Arrays(np.arange(20.0)[:, None], np.arange(20) % 2)
        >>> train, val = split_validation(data, 0.1, seed=0)
        >>> len(train), len(val), set(train.indices) & set(val.indices)
        (18, 2, set())
        >>> [len(part) for part in split_validation(data, 0.001)]  # Keras: one row still held out
        [19, 1]
    """
    if not 0.0 < float(fraction) < 1.0:
        raise ValueError(f"validation_split={fraction!r}: expected a fraction in (0, 1)")
    refusal = kind_of(source).split_refusal(source)
    if refusal is not None:
        raise ValueError(refusal)
    source = cast(IndexedSource, source)
    n = source.num_samples
    held = held_out(source, n, float(fraction))
    if held < 1 or held >= n:
        raise ValueError(
            f"validation_split={fraction}: of {n} samples that leaves {n - held} "
            f"for training and {held} for validation; both need at least one"
        )
    order = np.random.default_rng([seed, 0x5A11D]).permutation(n)
    return Subset(source, np.sort(order[held:])), Subset(source, np.sort(order[:held]))
