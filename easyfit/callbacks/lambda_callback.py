"""LambdaCallback: a callback made of plain functions."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from .callback import Callback

__all__ = ["LambdaCallback"]


def _hooks() -> set[str]:
    return {name for name in vars(Callback) if name.startswith("on_")}


class LambdaCallback(Callback):
    """Calls the given functions at the matching hooks (Keras semantics).

    Epoch hooks get ``(epoch, logs)``, batch hooks ``(batch, logs=...)``, the others
    ``(logs)``. Hooks not given cost nothing (batch logs are never built for them).

    Args:
        on_epoch_begin: ``f(epoch, logs)``, at each epoch's start.
        on_epoch_end: ``f(epoch, logs)``, at each epoch's end.
        on_train_begin: ``f(logs)``, when training starts.
        on_train_end: ``f(logs)``, when training ends.
        on_train_batch_begin: ``f(batch, logs=...)``, before each training batch.
        on_train_batch_end: ``f(batch, logs=...)``, after each training batch.
        **kwargs: any other hook (``on_test_end``, ``on_batch_end``, ``on_predict_batch_end``,
            ...) as a keyword; as in Keras, any other keyword becomes an attribute
            (``LambdaCallback(custom_method=fn).custom_method``), with a warning when its name
            starts with ``on_`` but is no hook (a typo would never be called).

    Example:
        >>> from easyfit.callbacks import LambdaCallback
        >>> seen = []
        >>> cb = LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(epoch))
        >>> cb.on_epoch_end(0, {"loss": 1.0}); seen
        [0]
    """

    def __init__(
        self,
        on_epoch_begin: Callable | None = None,
        on_epoch_end: Callable | None = None,
        on_train_begin: Callable | None = None,
        on_train_end: Callable | None = None,
        on_train_batch_begin: Callable | None = None,
        on_train_batch_end: Callable | None = None,
        **kwargs: Callable,
    ):
        super().__init__()
        given: dict[str, Any] = {
            "on_epoch_begin": on_epoch_begin,
            "on_epoch_end": on_epoch_end,
            "on_train_begin": on_train_begin,
            "on_train_end": on_train_end,
            "on_train_batch_begin": on_train_batch_begin,
            "on_train_batch_end": on_train_batch_end,
            **kwargs,
        }
        hooks = _hooks()
        for name, fn in given.items():
            if name.startswith("on_") and name not in hooks:
                warnings.warn(
                    f"LambdaCallback: {name} is not a callback hook (hooks: {', '.join(sorted(hooks))}); "
                    "it is kept as an attribute and never called",
                    UserWarning,
                    stacklevel=2,
                )
            if fn is not None:
                setattr(self, name, fn)
