"""The one small interface every data source implements.

A source says what its samples are and how DALI turns one into an (image, label) pair. It knows
nothing of devices, batches, epochs or shuffling: the loader (``easyfit.data.loader``) owns those.

The contract, for index-driven sources (every sample addressable by an integer):

* ``num_samples``: how many samples there are.
* ``feed(indices)``: the host-side inputs for those samples, one array (or one list of
  per-sample arrays) per DALI ``external_source``; cheap (paths, small arrays), never decoded
  pixels unless the source is in memory anyway.
* ``graph(*nodes, device=...)``: DALI operators from those inputs to ``(x, y)`` data nodes, run
  inside the pipeline definition. ``x`` is HWC (uint8 for images); ``y`` one label per sample.
* ``scale``: the factor the train step multiplies ``x`` by after casting it to float32
  (``1/255`` for 8-bit images, so that batches arrive in [0, 1]; ``None`` for none).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Source", "Subset"]


class Source(abc.ABC):
    """Base class of easyfit's data sources.

    Subclasses implement ``num_samples``, ``num_feeds``, ``feed`` and ``graph``; everything else
    has a default.
    """

    #: Factor applied to ``x`` (cast to float32) in the train step; None to leave it as is.
    scale: float | None = 1.0 / 255.0
    #: Sorted class names when labels are class indices, else None.
    class_names: list[str] | None = None

    @property
    @abc.abstractmethod
    def num_samples(self) -> int:
        """Number of samples."""

    @property
    @abc.abstractmethod
    def num_feeds(self) -> int:
        """How many arrays ``feed`` returns (one DALI external_source each)."""

    @abc.abstractmethod
    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        """Host inputs for the samples at ``indices`` (one entry per external source)."""

    @abc.abstractmethod
    def graph(self, *nodes: Any, device: str) -> tuple[Any, Any]:
        """DALI operators turning the fed nodes into ``(x, y)``.

        Args:
            *nodes: the external_source data nodes, in the order of ``feed``'s result.
            device: ``"cpu"`` or ``"gpu"``, where the pipeline's outputs are wanted.
        """

    def describe(self) -> str:
        """A short human description, used in logs and error messages."""
        return type(self).__name__

    @property
    def label_dtype(self) -> np.dtype:
        """dtype of the labels (integer labels mean class indices)."""
        return np.dtype(np.int32)

    @property
    def sample_nbytes(self) -> int | None:
        """Bytes of one decoded sample (inputs and label), if known without decoding."""
        return None

    #: Whether ``graph`` applies random operations (augmentation): such a source is never
    #: cached, since its samples differ every epoch.
    random: bool = False

    def check(self) -> None:
        """Checks cheap to do before a pipeline starts; raises DataError. Default: nothing."""

    def __len__(self) -> int:
        return self.num_samples


class Subset(Source):
    """The samples of ``source`` at ``indices`` (used by validation_split).

    Example:
        >>> import numpy as np, easyfit as ef
        >>> full = ef.data.Arrays(np.zeros((10, 2, 2, 1), np.uint8), np.arange(10))
        >>> part = ef.data.Subset(full, [1, 3, 5])
        >>> len(part), part.feed(np.array([2]))[1].tolist()
        (3, [5])
    """

    def __init__(self, source: Source, indices: Sequence[int] | np.ndarray):
        self.source = source
        self.indices = np.asarray(indices, dtype=np.int64)
        self.scale = source.scale
        self.class_names = source.class_names

    @property
    def num_samples(self) -> int:
        return len(self.indices)

    @property
    def num_feeds(self) -> int:
        return self.source.num_feeds

    @property
    def label_dtype(self) -> np.dtype:
        return self.source.label_dtype

    @property
    def sample_nbytes(self) -> int | None:
        return self.source.sample_nbytes

    @property
    def random(self) -> bool:  # type: ignore[override]
        return self.source.random

    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        return self.source.feed(self.indices[indices])

    def graph(self, *nodes: Any, device: str) -> tuple[Any, Any]:
        return self.source.graph(*nodes, device=device)

    def describe(self) -> str:
        return f"{self.source.describe()} [{self.num_samples} of {self.source.num_samples}]"
