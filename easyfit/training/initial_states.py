"""Moved to :mod:`easyfit.core.initial_states`; this path is kept for one release, with a warning."""

import sys
import warnings

from ..core import initial_states as _moved

warnings.warn(
    "easyfit.training.initial_states moved to easyfit.core.initial_states; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
