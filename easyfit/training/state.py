"""Moved to :mod:`easyfit.core.state`; this path is kept for one release, with a warning."""

import sys
import warnings

from ..core import state as _moved

warnings.warn(
    "easyfit.training.state moved to easyfit.core.state; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
