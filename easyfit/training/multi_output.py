"""Moved to :mod:`easyfit.core.multi_output`; this path is kept for one release, with a warning."""

import sys
import warnings

from ..core import multi_output as _moved

warnings.warn(
    "easyfit.training.multi_output moved to easyfit.core.multi_output; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
