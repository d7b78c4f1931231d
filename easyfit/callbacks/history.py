"""History: the per-epoch logs of a fit, as in Keras."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .callback import Callback, Logs

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["History"]


class History(Callback):
    """Records every epoch's logs; ``fit`` returns it.

    fit adds one after the other callbacks, so that the keys they add to the epoch logs are
    recorded too; a History given in ``callbacks`` is used (and returned) instead, where it
    stands in the list, as in Keras.

    Attributes:
        history: ``{"loss": [...], "accuracy": [...], "val_loss": [...], ...}``, one value per
            epoch.
        epoch: the epoch indices recorded.

    Example:
        >>> from easyfit.callbacks import History
        >>> h = History()
        >>> h.on_train_begin()
        >>> h.on_epoch_end(0, {"loss": 0.5})
        >>> h.history, h.epoch
        ({'loss': [0.5]}, [0])
    """

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []

    def on_train_begin(self, logs: Logs | None = None) -> None:
        self.epoch = []

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        self.epoch.append(epoch)
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(value)
        if self._trainer is not None:
            self._trainer.history = self  # as Keras: the model's history is the latest run's

    def plot(self, path: str | os.PathLike | None = None, metrics: Sequence[str] | None = None) -> Figure:
        """Draws loss and every metric per epoch (training and validation) with matplotlib.

        What fit adds to the logs is left out unless ``metrics`` names it: ``input_wait``,
        and ``learning_rate`` when it never changed.

        Args:
            path: where to save a PNG (None: do not save); written whole to a staging name
                and renamed, so a failed save leaves the previous image as it was.
            metrics: the quantities to draw, one panel each, without ``val_`` (e.g.
                ``["loss", "input_wait"]``; None: loss and the training metrics).

        Returns:
            The matplotlib Figure. A notebook cell ending in ``history.plot()`` shows it once,
            with no ``%matplotlib`` magic.

        Raises:
            ImportError: matplotlib is not installed (``pip install "easyfit-flax[plot]"``).
            ValueError: no epoch has ended, or ``metrics`` names what the history lacks.
        """
        from ._plot import plot_history

        return plot_history(self.history, self.epoch, path, metrics)
