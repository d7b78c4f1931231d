"""``validation_split``: now beside ``Subset`` in the source contract,
``easyfit.data.sources.base``; this module keeps the old import path working."""

from .sources.base import held_out, split_validation

__all__ = ["held_out", "split_validation"]
