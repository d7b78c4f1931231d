"""Moved to :mod:`easyfit.core.learning_rate`; this path is kept for one release, with a warning."""

import sys
import warnings

from ..core import learning_rate as _moved

warnings.warn(
    "easyfit.training.learning_rate moved to easyfit.core.learning_rate; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
