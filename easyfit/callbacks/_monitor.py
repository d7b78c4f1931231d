"""A metric watched in the epoch logs, and what counts as an improvement (shared by
EarlyStopping, ModelCheckpoint and ReduceLROnPlateau)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["Monitor"]

_HIGHER_IS_BETTER = ("acc", "auc", "precision", "recall", "f1")


class Monitor:
    """Keras' ``monitor`` / ``mode`` / ``min_delta`` triple.

    Args:
        monitor: the key in the logs (``"val_loss"``, ``"accuracy"``, ...).
        mode: ``"min"``, ``"max"``, or ``"auto"`` (max for accuracies, AUC, precision, recall
            and F1, min otherwise).
        min_delta: the smallest change that counts as an improvement.

    Example:
        >>> from easyfit.callbacks._monitor import Monitor
        >>> m = Monitor("val_accuracy", min_delta=0.01)
        >>> m.mode, m.improved(0.905, 0.9), m.improved(0.92, 0.9), m.improved(0.5, None)
        ('max', False, True, True)
    """

    def __init__(self, monitor: str, mode: str = "auto", min_delta: float = 0.0):
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"mode={mode!r}: expected 'auto', 'min' or 'max'")
        if mode == "auto":
            mode = "max" if any(s in monitor for s in _HIGHER_IS_BETTER) else "min"
        self.monitor = monitor
        self.mode = mode
        self.min_delta = abs(float(min_delta))

    @property
    def worst(self) -> float:
        """The value every real one improves on."""
        return math.inf if self.mode == "min" else -math.inf

    def improved(self, current: float, reference: float | None) -> bool:
        """Whether ``current`` beats ``reference`` by more than ``min_delta``."""
        if reference is None:
            return True
        if self.mode == "min":
            return current < reference - self.min_delta
        return current > reference + self.min_delta

    def value(self, logs: Mapping[str, Any] | None, owner: str) -> float | None:
        """The monitored value in ``logs``; warns (naming ``owner``) and returns None if absent."""
        value = (logs or {}).get(self.monitor)
        if value is None:
            warnings.warn(
                f"{owner}: {self.monitor!r} is not in the logs (available: "
                f"{', '.join(sorted(logs or {}))}); it does nothing this time",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
        return float(value)


def check_freq(value: Any, argument: str) -> Any:
    """``"epoch"`` or a positive int (batches), else ValueError naming ``argument``."""
    if value == "epoch" or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise ValueError(f"{argument}={value!r}: expected 'epoch' or a positive number of batches")
