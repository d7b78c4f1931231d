"""Checks of fit / evaluate / predict's numeric arguments, at entry, naming the argument.

A bad number caught here would otherwise be replaced silently (``batch_size=0`` by the default),
misdiagnosed (``batch_size=-8`` as "does not divide evenly") or ignored (``epochs=-1``: no
epoch, an empty History).
"""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["check_int", "check_momentum", "check_verbose"]


def check_int(name: str, value: Any, minimum: int, *, none: bool = False) -> None:
    """Raises ValueError unless ``value`` is an integer >= ``minimum`` (or None, if allowed).

    Example:
        >>> from easyfit.training.args import check_int
        >>> check_int("batch_size", 0, 1, none=True)
        Traceback (most recent call last):
        ...
        ValueError: batch_size=0: expected an integer >= 1 (or None for the default)
    """
    if value is None and none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        default = " (or None for the default)" if none else ""
        raise ValueError(f"{name}={value!r}: expected an integer >= {minimum}{default}")


def check_momentum(value: Any) -> float | None:
    """``ema_momentum`` as a float in [0, 1], or None; else ValueError (Keras' range)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= float(value) <= 1:
        raise ValueError(
            f"ema_momentum={value!r}: expected a number in [0, 1], or None for no moving average"
        )
    return float(value)


def check_verbose(value: Any) -> int:
    """``verbose`` as 0, 1 or 2 (``"auto"`` and True are 1, as in Keras); else ValueError."""
    if value == "auto":
        return 1
    if isinstance(value, numbers.Integral) and value in (0, 1, 2):
        return int(value)
    raise ValueError(
        f"verbose={value!r}: expected 0 (silent), 1 (progress bar), 2 (one line per epoch) or 'auto'"
    )
