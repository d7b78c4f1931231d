"""One file per data format, and ``base.py`` with the kinds of source (see docs/architecture.md).

A new format is one new file here: a subclass of :class:`~easyfit.data.sources.base.IndexedSource`
or :class:`~easyfit.data.sources.base.ReaderSource`, which registers how a path of it is
recognised (:mod:`~easyfit.data.sources.registry`), and one line below that imports it (the
import registers it: ``easyfit.data.detect`` recognises it from then on).
"""

from .arrays import Arrays
from .base import READER, IndexedSource, ReaderSource, Source, Subset
from .caffe2 import Caffe2LMDB
from .folder import IMAGE_EXTENSIONS, ImageFiles, ImageFolder
from .image_csv import ImageCSV
from .numpy_folder import NumpyFolder
from .parquet import Parquet
from .recordio import RecordIO
from .segmentation import SegmentationFolder
from .tfrecord import TFRecord
from .webdataset import WebDataset

__all__ = [
    "IMAGE_EXTENSIONS",
    "READER",
    "Arrays",
    "Caffe2LMDB",
    "ImageCSV",
    "ImageFiles",
    "ImageFolder",
    "IndexedSource",
    "NumpyFolder",
    "Parquet",
    "ReaderSource",
    "RecordIO",
    "SegmentationFolder",
    "Source",
    "Subset",
    "TFRecord",
    "WebDataset",
]
