"""The fingerprint of a training source now lives with the source contract
(``easyfit.data.sources.base.data_fingerprint``); this path keeps the old import working."""

from .sources.base import data_fingerprint

__all__ = ["data_fingerprint"]
