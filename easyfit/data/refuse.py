"""The inputs easyfit does not take: now in ``easyfit.data.resolve`` (what users pass -> a
Source, decided in one place); this module keeps the old import path working."""

from .resolve import SUPPORTED, refuse, unsupported

__all__ = ["SUPPORTED", "refuse", "unsupported"]
