"""A metric watched in the epoch logs, and what counts as an improvement, with Keras' rules;
and the base of the callbacks that watch one (EarlyStopping, ModelCheckpoint and
ReduceLROnPlateau), as Keras' ``MonitorCallback``."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .callback import Callback, Logs

if TYPE_CHECKING:
    from .callback_list import CallbackList

__all__ = ["Monitor", "MonitorCallback"]

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
        stacklevel: the unknown ``mode``'s warning's, as ``warnings.warn``'s (the default
            names the caller of the caller: the user's line that made the callback).

    Example:
        >>> from easyfit.callbacks._monitor import Monitor
        >>> m = Monitor("val_loss", min_delta=0.01)
        >>> m.mode, m.resolve(None), m.improved(0.395, 0.4), m.improved(0.3, 0.4), m.improved(0.5, None)
        ('auto', 'min', False, True, True)
    """

    def __init__(
        self,
        monitor: str,
        mode: str = "auto",
        min_delta: float = 0.0,
        owner: str = "Monitor",
        stacklevel: int = 3,
    ):
        if mode not in ("auto", "min", "max"):
            warnings.warn(
                f"{owner} mode {mode!r} is unknown, fallback to auto mode.",
                UserWarning,
                stacklevel=stacklevel,
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


class MonitorCallback(Callback):
    """Base of the callbacks that watch ``monitor`` in the epoch logs (Keras'
    ``MonitorCallback``): ``monitor``, ``mode`` and ``monitor_op`` as Keras', and the value an
    epoch's logs give to judge (:meth:`_epoch_value`).

    Args:
        monitor: the key in the logs.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (:class:`Monitor`'s rules).
        min_delta: the smallest change that counts as an improvement.
        owner: the callback's name, for messages.
    """

    def __init__(self, monitor: str, mode: str, min_delta: float, owner: str):
        super().__init__()
        self._monitor = Monitor(monitor, mode, min_delta, owner, stacklevel=4)  # the user's line
        self.monitor = monitor
        self.mode = self._monitor.mode

    @property
    def monitor_op(self) -> Callable[..., Any] | None:
        """Keras' ``monitor_op``: ``np.less`` or ``np.greater`` once the direction is settled
        (at the first epoch's end), else None."""
        return self._monitor.op

    def _epoch_value(self, logs: Logs | None) -> float | None:
        """The monitored value of an epoch's ``logs``, its direction settled first (an unknown
        one raises ValueError); None for an epoch that does not count: one fit did not
        validate (``validation_freq``) for a ``val_`` monitor, or one whose logs lack it
        (warned)."""
        self._monitor.resolve(self._trainer)
        if self._monitor.unvalidated(self._callbacks, logs):
            return None
        return self._monitor.value(logs)
