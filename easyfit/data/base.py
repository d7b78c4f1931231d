"""The one small interface every data source implements.

A source says what its samples are and how DALI turns one into an (image, label) pair. It knows
nothing of devices, batches, epochs or shuffling: the loader (``easyfit.data.loader``) owns those.

The contract, for index-driven sources (every sample addressable by an integer):

* ``num_samples``: how many samples there are.
* ``feed(indices)``: the host-side inputs for those samples, one array (or one list of
  per-sample arrays) per DALI ``external_source``; cheap (paths, small arrays, the bytes of a
  record), never decoded pixels unless the source is in memory anyway.
* ``graph(*nodes, device=...)``: DALI operators from those inputs to ``(x, y)`` data nodes, run
  inside the pipeline definition. ``x`` is HWC (uint8 for images); ``y`` one label per sample.
* ``scale``: the factor the train step multiplies ``x`` by after casting it to float32
  (``1/255`` for 8-bit images, so that batches arrive in [0, 1]; ``None`` for none).

Reader-driven sources (``reader_driven = True``, see ``easyfit.data.reader``) let a DALI reader
choose the order instead; the loader is picked by :func:`easyfit.data.loader.make_loader`.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Sequence
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
    #: Training-only augmentation: ``f(x) -> x`` on DALI data nodes (see ``easyfit.data.Augment``).
    augment: Callable[[Any], Any] | None = None
    #: True when a DALI reader picks the order (``easyfit.data.reader.ReaderSource``).
    reader_driven: bool = False

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

    @property
    def random(self) -> bool:
        """Whether training batches get random augmentation (``augment=``): such a source is
        never cached, since its samples differ every epoch."""
        return getattr(self, "augment", None) is not None

    @property
    def uses_gpu(self) -> bool:
        """Whether ``graph(..., device="gpu")`` runs operators on the GPU (the GPU image
        decoder). When False, the loader runs the source's pipelines on the host even on GPU
        machines and copies the batches to the devices itself."""
        return False

    def known_labels(self) -> np.ndarray | None:
        """Every label, when the source knows them without decoding (checked before training)."""
        return None

    def locate(self, index: int) -> str:
        """Where sample ``index`` comes from (a file, a record), for error messages."""
        return f"{self.describe()}: sample {index}"

    def sample_problem(self, index: int) -> str | None:
        """A cheap host-side reason why sample ``index`` cannot be read (e.g. an unreadable or
        empty file), or None. Used to explain a failed batch."""
        return None

    def diagnose(self, suspects: Sequence[int]) -> str | None:
        """``"<file or record>: <what is wrong>"`` for a bad sample among ``suspects`` (the
        samples of a batch DALI failed to produce), or None. Default: each suspect is checked
        alone (``easyfit.data.diagnose.find_bad_sample``)."""
        from .diagnose import find_bad_sample

        return find_bad_sample(self, suspects)

    def sibling(self, path: str | os.PathLike) -> Source | None:
        """A source of this kind for another split at ``path``, with the same settings (image
        size, color mode, ...); None when ``path`` holds another kind of data."""
        return None

    def check(self) -> None:
        """Checks to do before the first pipeline of this source is built (called by
        :func:`~easyfit.data.loader.make_loader` before each; a source that checks much
        remembers it did); raises DataError. Default: nothing."""

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
        self.augment = source.augment

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
    def random(self) -> bool:
        return self.source.random

    @property
    def uses_gpu(self) -> bool:
        return self.source.uses_gpu

    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        return self.source.feed(self.indices[indices])

    def graph(self, *nodes: Any, device: str) -> tuple[Any, Any]:
        return self.source.graph(*nodes, device=device)

    def known_labels(self) -> np.ndarray | None:
        labels = self.source.known_labels()
        return None if labels is None else labels[self.indices]

    def check(self) -> None:
        self.source.check()

    def locate(self, index: int) -> str:
        return self.source.locate(int(self.indices[index]))

    def sample_problem(self, index: int) -> str | None:
        return self.source.sample_problem(int(self.indices[index]))

    def describe(self) -> str:
        return f"{self.source.describe()} [{self.num_samples} of {self.source.num_samples}]"
