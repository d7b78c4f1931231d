"""Which source reads a path: :func:`detect`, now in ``easyfit.data.resolve`` (what users pass
-> a Source, decided in one place); this module keeps the old import path working."""

from .resolve import detect

__all__ = ["detect"]
