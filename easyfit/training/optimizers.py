"""Moved to :mod:`easyfit.core.optimizers`; this path is kept for one release, with a warning."""

import sys
import warnings

from ..core import optimizers as _moved

warnings.warn(
    "easyfit.training.optimizers moved to easyfit.core.optimizers; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
