"""What some sources can do and others cannot, each a Protocol tested for by capability.

Every source has the members of :class:`~easyfit.data.sources.base.Source`. A member here is
optional: code that needs one asks ``isinstance(source, KnownLabels)`` (these Protocols are
``runtime_checkable``), never which class the source is, so that a new format gains a
capability by having its members. A :class:`~easyfit.data.sources.base.Subset` has the
capabilities of the source it is part of, its samples renumbered.

* :class:`KnownLabels`: every label, known without decoding (checked whole before training).
* :class:`FedLabels`: labels learnt only as they are fed, checked once the model's outputs
  are known; :class:`DecodedLabels`: labels decoded by DALI (a mask's class ids), checked per
  batch.
* :class:`SampleChecks`, :class:`EncodedSamples`: a host check of one sample, and its encoded
  image (what explains a failed batch, and ``easyfit check``).
* :class:`View`: the samples of another source at some indices (``validation_split``).
* :class:`InMemory`: arrays held in memory (Keras' ``fit(x, y)``).
* :class:`FileBacked`, :class:`RecordsLayout`, :class:`FolderListing`: the files read, what
  their index read of them, and what a folder's listing left out.
* :class:`Blocked`: samples stored in blocks read whole (Parquet's row groups), which a
  shuffled pass reads window by window when they do not fit the source's cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from ..plan import Windows
    from .base import Source

__all__ = [
    "Blocked",
    "DecodedLabels",
    "EncodedSamples",
    "FedLabels",
    "FileBacked",
    "FolderListing",
    "InMemory",
    "KnownLabels",
    "RecordsLayout",
    "SampleChecks",
    "View",
    "base_of",
    "known_labels",
]


@runtime_checkable
class KnownLabels(Protocol):
    """A source that knows its labels without decoding."""

    def known_labels(self) -> Any:
        """Every label (checked before training): an array, or a dict or tuple of arrays for
        several outputs; None when, for this data, they are not known after all."""


@runtime_checkable
class FedLabels(Protocol):
    """A source that learns its labels as it feeds them (``known_labels`` None)."""

    def limit_labels(self, num_classes: int) -> None:
        """From now on, a fed class index outside ``0..num_classes - 1`` raises DataError naming
        its sample (and so do those already fed); called once the model's outputs are known."""


@runtime_checkable
class DecodedLabels(Protocol):
    """A source whose labels DALI decodes (a segmentation mask's class ids)."""

    def decoded_label_limit(self) -> int | None:
        """The number of classes the decoded labels must stay below, once ``limit_labels``
        said it: the pipelines check every batch of them and name the sample of one outside."""


@runtime_checkable
class Blocked(Protocol):
    """A source stored in blocks that are read whole (Parquet's row groups)."""

    def shuffle_windows(self) -> Windows | None:
        """How a shuffled pass reads the blocks when they do not all fit the source's cache
        (``easyfit.data.plan.Windows``: each block read once per pass); None: a permutation
        of all the samples."""


@runtime_checkable
class SampleChecks(Protocol):
    """A source that can check one sample on the host, cheaply."""

    def sample_problem(self, index: int) -> str | None:
        """Why sample ``index`` cannot be read (an unreadable or empty file, a broken image),
        or None. Explains a failed batch (``easyfit.data.diagnose``)."""


@runtime_checkable
class EncodedSamples(Protocol):
    """A source of encoded images, one per sample."""

    def encoded_image(self, index: int) -> bytes | None:
        """The encoded image of sample ``index`` (for messages about it)."""


@runtime_checkable
class View(Protocol):
    """The samples of ``source`` at ``indices``."""

    source: Source
    indices: np.ndarray


@runtime_checkable
class InMemory(Protocol):
    """Inputs ``x`` and labels ``y`` held in memory, one row per sample (arrays, or a dict or
    tuple of them)."""

    x: Any
    y: Any


@runtime_checkable
class FileBacked(Protocol):
    """A source read from ``files``, under ``root`` (what ``easyfit check`` is given)."""

    root: str
    files: list[str]


@runtime_checkable
class RecordsLayout(Protocol):
    """Record files indexed when the source was built."""

    def records_layout(self) -> tuple[np.ndarray, ...]:
        """What the index read of the files (byte ranges, row groups, labels): a resumed fit's
        data fingerprint compares it with the backup's."""


@runtime_checkable
class FolderListing(Protocol):
    """A source listed from a folder."""

    #: What the listing left out (hidden entries, other files...), in words; None: nothing.
    left_out: str | None


def base_of(source: Source) -> Source:
    """The source ``source`` is a view of (through every :class:`View`), else itself."""
    while isinstance(source, View):
        source = source.source
    return source


def known_labels(source: Source) -> Any:
    """``source.known_labels()`` when it has :class:`KnownLabels`, else None."""
    return source.known_labels() if isinstance(source, KnownLabels) else None
