"""easyfit: Keras-style training for Flax models, with NVIDIA DALI as the input pipeline.

Example:
    >>> import easyfit as ef
    >>> ef.Trainer, ef.History, ef.data.ImageFolder  # doctest: +ELLIPSIS
    (<class 'easyfit.training.trainer.Trainer'>, ...)
"""

from typing import Any

from ._env import arrange_environment

arrange_environment()  # before anything below can start JAX's backend

from . import callbacks, data, datasets, distributed, errors, metrics  # noqa: E402
from .callbacks import Callback, History  # noqa: E402
from .errors import CheckpointError, DataError  # noqa: E402
from .persistence import checkpoint  # noqa: E402
from .training.trainer import Trainer  # noqa: E402


def __getattr__(name: str) -> Any:
    """``easyfit.models`` on its first use: it imports ``flax.nnx``, which a linen user's
    ``import easyfit`` should not wait for."""
    if name == "models":
        import importlib

        return importlib.import_module(".models", __name__)
    raise AttributeError(f"module 'easyfit' has no attribute {name!r}")


__version__ = "0.1.0"  # the only place the version is written (pyproject reads it)

__all__ = [
    "Callback",
    "CheckpointError",
    "DataError",
    "History",
    "Trainer",
    "__version__",
    "callbacks",
    "checkpoint",
    "data",
    "datasets",
    "distributed",
    "errors",
    "metrics",
    "models",
]
