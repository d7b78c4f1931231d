"""Moved to :mod:`easyfit.core.metrics`; this path is kept for one release, with a warning."""

import sys
import warnings

from ..core import metrics as _moved

warnings.warn(
    "easyfit.training.metrics moved to easyfit.core.metrics; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
