"""Moved to :mod:`easyfit.core.losses`; this path is kept for one release, with a warning."""

import sys
import warnings

from ..core import losses as _moved

warnings.warn(
    "easyfit.training.losses moved to easyfit.core.losses; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
