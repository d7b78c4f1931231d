"""A metric watched in the epoch logs, and what counts as an improvement (shared by
EarlyStopping, ModelCheckpoint and ReduceLROnPlateau), with Keras' rules."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .callback_list import CallbackList

__all__ = ["Monitor", "monitor_op_property"]

_BY_DIRECTION = {"up": "max", "down": "min"}


class Monitor:
    """Keras' ``monitor`` / ``mode`` / ``min_delta`` triple.

    In ``"auto"`` mode the direction is Keras': ``loss`` and ``val_loss`` are minimised; any
    other metric goes the way the trainer's metric of that name declares (``Trainer.
    metric_direction``: easyfit's named metrics declare it, a custom one may, through Keras'
    ``_direction`` attribute); anything else raises ValueError, as Keras does: pass ``mode``.
    Nothing is guessed from parts of the name. The direction is settled when first needed
    (``resolve``), once the trainer's metrics are known.

    Args:
        monitor: the key in the logs (``"val_loss"``, ``"accuracy"``, ...).
        mode: ``"min"``, ``"max"``, or ``"auto"``; anything else warns and means ``"auto"``,
            as in Keras.
        min_delta: the smallest change that counts as an improvement.
        owner: the callback's name, for messages.

    Example:
        >>> from easyfit.callbacks._monitor import Monitor
        >>> m = Monitor("val_loss", min_delta=0.01)
        >>> m.mode, m.resolve(None), m.improved(0.395, 0.4), m.improved(0.3, 0.4), m.improved(0.5, None)
        ('auto', 'min', False, True, True)
    """

    def __init__(self, monitor: str, mode: str = "auto", min_delta: float = 0.0, owner: str = "Monitor"):
        if mode not in ("auto", "min", "max"):
            warnings.warn(
                f"{owner} mode {mode!r} is unknown, fallback to auto mode.", UserWarning, stacklevel=3
            )
            mode = "auto"
        self.monitor = monitor
        self.mode = mode
        self.min_delta = abs(float(min_delta))
        self.owner = owner
        self.direction: str | None = None if mode == "auto" else mode

    def resolve(self, trainer: Any) -> str:
        """The direction, ``"min"`` or ``"max"``; in auto mode by Keras' rule (above), from
        ``trainer``'s metrics.

        Raises:
            ValueError: auto mode, and the direction of ``monitor`` is not known.
        """
        if self.direction is None:
            name = self.monitor.removeprefix("val_")
            declared = None if trainer is None else trainer.metric_direction(name)
            self.direction = "min" if name == "loss" else _BY_DIRECTION.get(declared or "")
            if self.direction is None:
                raise ValueError(
                    f"{self.owner}: monitor={self.monitor!r}, and whether it should be maximized "
                    "or minimized is not known (only loss, and metrics that declare a direction, "
                    "such as easyfit's named metrics, are known). Pass mode='max' to keep the "
                    "highest value, or mode='min' the lowest."
                )
        return self.direction

    @property
    def op(self) -> Callable[..., Any] | None:
        """Keras' ``monitor_op``: ``np.less`` (min) or ``np.greater`` (max); None until the
        direction is settled."""
        return None if self.direction is None else np.less if self.direction == "min" else np.greater

    def improved(self, current: float, reference: float | None) -> bool:
        """Whether ``current`` beats ``reference`` by more than ``min_delta`` (anything beats
        None)."""
        if reference is None:
            return True
        if self.direction == "min":
            return current < reference - self.min_delta
        if self.direction == "max":
            return current > reference + self.min_delta
        raise RuntimeError(f"{self.owner}: the direction of {self.monitor!r} is not settled yet")

    def unvalidated(self, callbacks: CallbackList | None, logs: Mapping[str, Any] | None) -> bool:
        """Whether ``monitor`` is a ``val_`` metric absent from the epoch logs because fit did
        not validate that epoch, on purpose (``validation_freq``, as ``callbacks``, the fit's
        CallbackList, says): such an epoch is no improvement and no lack of one, and no
        warning is due (Keras warns, and its ModelCheckpoint saves)."""
        return (
            self.monitor.startswith("val_")
            and self.monitor not in (logs or {})
            and callbacks is not None
            and callbacks.validation_skipped
        )

    def value(self, logs: Mapping[str, Any] | None, then: str = "") -> float | None:
        """The monitored value in ``logs``; warns (adding ``then``: what happens instead) and
        returns None if absent, as Keras."""
        value = (logs or {}).get(self.monitor)
        if value is None:
            warnings.warn(
                f"{self.owner} is conditioned on metric {self.monitor!r}, which is not available "
                f"(available: {', '.join(logs or {})}){then}",
                UserWarning,
                stacklevel=3,
            )
            return None
        return float(value)


def _monitor_op(self: Any) -> Callable[..., Any] | None:
    return self._monitor.op


#: Keras' ``monitor_op`` for a callback holding a ``_monitor``: ``np.less`` or ``np.greater``
#: once the direction is settled (at the first epoch's end), else None.
monitor_op_property = property(_monitor_op)
