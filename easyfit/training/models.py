"""Moved to :mod:`easyfit.core.models`; this path is kept for one release, with a warning."""

import sys
import warnings

from ..core import models as _moved

warnings.warn(
    "easyfit.training.models moved to easyfit.core.models; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
