"""Data sources: what the samples are and how DALI reads them.

Every source goes through the same DALI-backed loader, with the same sharding and the same
exactly-once evaluation and prediction. A path is turned into a source by
:func:`~easyfit.data.detect.detect` from what the directory holds.
"""

from .arrays import Arrays
from .augment import Augment
from .base import Source, Subset
from .caffe2 import Caffe2LMDB
from .detect import detect
from .folder import IMAGE_EXTENSIONS, ImageFolder
from .numpy_folder import NumpyFolder
from .order import Plan, epoch_permutation
from .reader import ReaderSource
from .recordio import RecordIO
from .resolve import VALIDATION_NAMES, split_layout, to_source
from .split import split_validation
from .tfrecord import TFRecord
from .webdataset import WebDataset

__all__ = ["IMAGE_EXTENSIONS", "VALIDATION_NAMES", "Arrays", "Augment", "Caffe2LMDB",
           "ImageFolder", "NumpyFolder", "Plan", "ReaderSource", "RecordIO", "Source", "Subset",
           "TFRecord", "WebDataset", "detect", "epoch_permutation", "split_layout",
           "split_validation", "to_source"]
