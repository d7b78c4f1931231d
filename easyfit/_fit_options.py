"""Keras' fit options that need a little checking: ``class_weight`` and ``validation_freq``."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Collection, Mapping

__all__ = ["class_weights", "validation_epochs"]


def class_weights(class_weight: Mapping[int, float] | None) -> tuple[float, ...] | None:
    """``{class index: weight}`` as one weight per class index (1.0 for classes not named).

    Example:
        >>> from easyfit._fit_options import class_weights
        >>> class_weights({0: 1.0, 2: 5.0})
        (1.0, 1.0, 5.0)
    """
    if class_weight is None:
        return None
    if not isinstance(class_weight, Mapping) or not class_weight:
        raise TypeError(f"class_weight={class_weight!r}: expected a dict {{class index: weight}}")
    for k, w in class_weight.items():
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise ValueError(f"class_weight: key {k!r} is not a class index (an integer >= 0)")
        if not isinstance(w, numbers.Real) or w < 0:
            raise ValueError(f"class_weight[{k}]={w!r}: expected a number >= 0")
    weights = [1.0] * (max(int(k) for k in class_weight) + 1)
    for k, w in class_weight.items():
        weights[int(k)] = float(w)
    return tuple(weights)


def validation_epochs(validation_freq: int | Collection[int]) -> Callable[[int], bool]:
    """Whether epoch ``e`` (0-based) validates: every ``validation_freq``-th epoch, or the
    1-based epochs listed (Keras' semantics).

    Example:
        >>> from easyfit._fit_options import validation_epochs
        >>> [validation_epochs(2)(e) for e in range(4)], validation_epochs([1, 3])(2)
        ([False, True, False, True], True)
    """
    if isinstance(validation_freq, numbers.Integral) and not isinstance(validation_freq, bool):
        if validation_freq < 1:
            raise ValueError(
                f"validation_freq={validation_freq!r}: expected an integer >= 1 or a collection of epochs"
            )
        freq = int(validation_freq)
        return lambda epoch: (epoch + 1) % freq == 0
    if isinstance(validation_freq, Collection) and not isinstance(validation_freq, str):
        epochs = {int(e) for e in validation_freq}
        return lambda epoch: epoch + 1 in epochs
    raise TypeError(
        f"validation_freq={validation_freq!r}: expected an integer >= 1 or a collection of epochs"
    )
