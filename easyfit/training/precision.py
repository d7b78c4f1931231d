"""Moved to :mod:`easyfit.core.precision`; this path is kept for one release, with a warning."""

import sys
import warnings

from ..core import precision as _moved

warnings.warn(
    "easyfit.training.precision moved to easyfit.core.precision; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
