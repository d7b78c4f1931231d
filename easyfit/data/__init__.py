"""Data sources: what the samples are and how DALI reads them.

Every source goes through the same DALI-backed streams, with the same sharding and the same
exactly-once evaluation and prediction. A path is turned into a source by
:func:`~easyfit.data.resolve.detect` from what the directory holds. The trainer reaches all of it
through :class:`~easyfit.data.inputs.DataInputs` (see docs/architecture.md).
"""

from .augment import Augment
from .detect import detect  # the module, then the function bound over its name
from .find_bad import check
from .inputs import DataInputs
from .loader import Loader
from .plan import Plan, epoch_permutation
from .resolve import VALIDATION_NAMES, split_layout, to_source
from .sources import (
    IMAGE_EXTENSIONS,
    Arrays,
    Caffe2LMDB,
    ImageCSV,
    ImageFiles,
    ImageFolder,
    IndexedSource,
    NumpyFolder,
    Parquet,
    ReaderSource,
    RecordIO,
    SegmentationFolder,
    Source,
    Subset,
    TFRecord,
    WebDataset,
)
from .split import split_validation
from .stream import LoaderOptions, Stream, StreamRequest

__all__ = [
    "IMAGE_EXTENSIONS",
    "VALIDATION_NAMES",
    "Arrays",
    "Augment",
    "Caffe2LMDB",
    "DataInputs",
    "ImageCSV",
    "ImageFiles",
    "ImageFolder",
    "IndexedSource",
    "Loader",
    "LoaderOptions",
    "NumpyFolder",
    "Parquet",
    "Plan",
    "ReaderSource",
    "RecordIO",
    "SegmentationFolder",
    "Source",
    "Stream",
    "StreamRequest",
    "Subset",
    "TFRecord",
    "WebDataset",
    "check",
    "detect",
    "epoch_permutation",
    "split_layout",
    "split_validation",
    "to_source",
]
