"""Data sources: what the samples are and how DALI reads them.

Every source goes through the same DALI-backed loader, with the same sharding and the same
exactly-once evaluation and prediction.
"""

from .arrays import Arrays
from .base import Source, Subset
from .folder import IMAGE_EXTENSIONS, ImageFolder
from .order import Plan, epoch_permutation
from .resolve import VALIDATION_NAMES, split_layout, to_source

__all__ = ["IMAGE_EXTENSIONS", "VALIDATION_NAMES", "Arrays", "ImageFolder", "Plan", "Source",
           "Subset", "epoch_permutation", "split_layout", "to_source"]
