"""Moved to :mod:`easyfit.data.pipelines` (``ReaderPipelines``, with the other kind's pipelines and
what both share); this path is kept for one release, with a warning."""

import sys
import warnings

from . import pipelines as _moved

warnings.warn(
    "easyfit.data.reader_pipelines moved to easyfit.data.pipelines; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
