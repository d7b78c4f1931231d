"""Moved to :mod:`easyfit.data.loader` (the kinds of source, ``stream_request`` and
``decide_cache``, beside ``open_stream``, which opens what they decide); this path is kept for
one release, with a warning."""

import sys
import warnings

from . import loader as _moved

warnings.warn(
    "easyfit.data.kinds moved to easyfit.data.loader; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
