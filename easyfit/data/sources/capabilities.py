"""What some sources can do and others cannot, each a Protocol tested for by capability: now
part of the source contract, ``easyfit.data.sources.base``; this module keeps the old import
path working.

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

from .base import (
    Blocked,
    DecodedLabels,
    EncodedSamples,
    FedLabels,
    FileBacked,
    FolderListing,
    InMemory,
    KnownLabels,
    RecordsLayout,
    SampleChecks,
    View,
    base_of,
    known_labels,
)

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
