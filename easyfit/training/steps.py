"""Moved to :mod:`easyfit.core.steps`; this path is kept for one release, with a warning."""

import sys
import warnings

from ..core import steps as _moved

warnings.warn(
    "easyfit.training.steps moved to easyfit.core.steps; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
