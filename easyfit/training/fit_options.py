"""fit's options, checked at entry (:class:`FitArgs`), and those that need a little more:
``class_weight`` and ``validation_freq``."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from .args import check_int, check_verbose

__all__ = ["FitArgs", "check_class_weight", "class_weights", "validation_epochs"]


def _class_index_key(key: object) -> int:
    """The class index a ``class_weight`` key names: an int, or a numeric string or an integral
    float as JSON gives them (``"3"``, ``3.0``); ValueError naming the key otherwise."""
    index: int | None = None
    if isinstance(key, numbers.Integral) and not isinstance(key, bool):
        index = int(key)
    elif isinstance(key, numbers.Real) and not isinstance(key, bool) and float(key).is_integer():
        index = int(float(key))
    elif isinstance(key, str):
        with contextlib.suppress(ValueError):
            index = int(key.strip())
    if index is None or index < 0:
        raise ValueError(
            f"class_weight: key {key!r} is not a class index: expected an integer >= 0 (or its "
            "string, as JSON gives it)"
        )
    return index


def class_weights(class_weight: Mapping[Any, float] | None) -> tuple[float, ...] | None:
    """``{class index: weight}`` as one weight per class index up to the largest key (1.0 for
    classes not named; the classes past it weigh 1.0 too, see ``easyfit.core.steps.weighted``).
    Keys may be ints, numeric strings or integral floats; ``{}`` weighs nothing (None).

    Example:
        >>> from easyfit.training.fit_options import class_weights
        >>> class_weights({0: 1.0, "2": 5.0})
        (1.0, 1.0, 5.0)
    """
    if class_weight is None:
        return None
    if not isinstance(class_weight, Mapping):
        raise ValueError(f"class_weight={class_weight!r}: expected a dict {{class index: weight}}")
    weights: dict[int, float] = {}
    for key, w in class_weight.items():
        index = _class_index_key(key)
        if index in weights:
            raise ValueError(f"class_weight: key {key!r} names class {index}, which another key names too")
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w < 0:
            raise ValueError(f"class_weight[{key!r}]={w!r}: expected a number >= 0")
        weights[index] = float(w)
    if not weights:
        return None
    return tuple(weights.get(c, 1.0) for c in range(max(weights) + 1))


def check_class_weight(class_weight: Mapping[Any, float], num_classes: int) -> None:
    """ValueError naming the first ``class_weight`` key past the model's ``num_classes``
    classes (a key that would never weigh a sample)."""
    for key in class_weight:
        if _class_index_key(key) >= num_classes:
            raise ValueError(
                f"class_weight: key {key!r} names no class: the model's outputs have {num_classes} "
                f"classes (0 to {num_classes - 1})"
            )


def validation_epochs(validation_freq: int | Collection[int]) -> Callable[[int], bool]:
    """Whether epoch ``e`` (0-based) validates: every ``validation_freq``-th epoch, or the
    1-based epochs listed (Keras' semantics).

    Example:
        >>> from easyfit.training.fit_options import validation_epochs
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
        epochs = set(validation_freq)
        if not all(isinstance(e, numbers.Integral) and not isinstance(e, bool) and e >= 1 for e in epochs):
            raise ValueError(f"validation_freq={validation_freq!r}: the epochs listed must be integers >= 1")
        return lambda epoch: epoch + 1 in epochs
    raise ValueError(
        f"validation_freq={validation_freq!r}: expected an integer >= 1 or a collection of epochs"
    )


@dataclasses.dataclass(frozen=True)
class FitArgs:
    """fit's arguments that shape its plan, checked (:meth:`check`), with what follows from
    them: the class weights by class index and which epochs validate."""

    batch_size: int | None
    epochs: int
    initial_epoch: int
    steps_per_epoch: int | None
    validation_steps: int | None
    validation_split: float
    validation_freq: int | Sequence[int]
    shuffle: bool | str
    cache: bool | str
    class_weight: Mapping[Any, float] | None
    verbose: int  # 0 but in process 0, which reports
    weights: tuple[float, ...] | None  # class_weight by class index
    validates: Callable[[int], bool]  # whether epoch e (0-based) validates

    @classmethod
    def check(cls, **given: Any) -> FitArgs:
        """fit's arguments (by name; see ``Trainer.fit``), or ValueError naming the first that
        is wrong."""
        for name, minimum, none in [
            ("batch_size", 1, True),
            ("epochs", 0, False),
            ("initial_epoch", 0, False),
            ("steps_per_epoch", 1, True),
            ("validation_steps", 1, True),
        ]:
            check_int(name, given[name], minimum, none=none)
        shuffle = given["shuffle"]
        if not isinstance(shuffle, (bool, np.bool_)) and shuffle != "batch":
            raise ValueError(f"shuffle={shuffle!r}: expected True, False or 'batch'")
        given["shuffle"] = shuffle if shuffle == "batch" else bool(shuffle)
        given["verbose"] = check_verbose(given["verbose"]) if jax.process_index() == 0 else 0
        weights = class_weights(given["class_weight"])
        return cls(**given, weights=weights, validates=validation_epochs(given["validation_freq"]))

    def settings(self, batch_size: int) -> dict[str, Any]:
        """What the processes of a fit must agree on of these (``distributed.agree_on_fit``)."""
        names = ("epochs", "initial_epoch", "steps_per_epoch", "shuffle", "cache", "validation_split")
        return {
            "batch_size": batch_size,
            **{name: getattr(self, name) for name in names},
            "validation_steps": self.validation_steps,
            "validation_freq": self.validation_freq,
            "class_weight": self.weights,
        }

    def data(self) -> dict[str, Any]:
        """What the training data is resolved with of these (``DataInputs.fit_data``): the
        shuffle its windows are decided for, and whether its notes are said."""
        return {"shuffle": self.shuffle, "verbose": bool(self.verbose)}

    def stream(self) -> dict[str, Any]:
        """What the training stream is opened with of these (``DataInputs.train_loader``)."""
        names = ("shuffle", "cache", "initial_epoch", "steps_per_epoch")
        return {name: getattr(self, name) for name in names}
