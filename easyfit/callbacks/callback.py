"""The callback base class, with Keras' hook names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..training.trainer import Trainer

__all__ = ["Callback"]

Logs = Mapping[str, Any]


class Callback:
    """Base class of callbacks: override the hooks you need.

    Hooks get ``logs``, a mapping of metric names to floats (``loss``, ``accuracy``,
    ``val_loss``, ...), and ``{}`` where there is nothing to report (the begin hooks), as in
    Keras. ``on_train_batch_end`` and ``on_test_batch_end`` get the running metrics of the
    epoch (or evaluation) so far, ``on_predict_batch_end`` gets ``{"outputs": ...}`` (the
    batch's predictions, on the host). Batch-level ``logs`` are computed only when read: a
    callback that does not look at them costs no host synchronisation, and hooks nobody
    overrides are never called. ``on_train_batch_begin`` / ``on_train_batch_end`` call
    ``on_batch_begin`` / ``on_batch_end`` unless overridden, as in Keras.

    With ``steps_per_execution=k`` batch hooks fire once per dispatch of k steps and ``batch``
    counts dispatches (0, 1, 2, ...), unlike Keras, which gives the index of the dispatch's
    first step to the begin hooks and of its last step to the end hooks (see
    [Coming from Keras](keras.md#callbacks)).

    Set ``self.model.stop_training = True`` to stop training (after the current batch; the
    epoch's end hooks still run), ``self.model.stop_evaluating`` / ``stop_predicting`` to end
    ``evaluate`` / ``predict`` after the current batch. ``self.model`` is the Trainer
    (``self.trainer`` too), and ``self.model.state`` the training state.

    A hook may also be given per instance (``self.on_train_batch_end = fn`` in ``__init__``):
    a callback that wants batch hooks only in some configurations then costs nothing in the
    others.

    Example:
        >>> import easyfit as ef
        >>> class StopAt(ef.callbacks.Callback):
        ...     def __init__(self, accuracy):
        ...         super().__init__()
        ...         self.accuracy = accuracy
        ...     def on_epoch_end(self, epoch, logs=None):
        ...         if logs["accuracy"] >= self.accuracy:
        ...             self.model.stop_training = True
    """

    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self.params: dict[str, Any] = {}

    @property
    def trainer(self) -> Trainer:
        """The Trainer running this callback (set by ``fit``, ``evaluate`` and ``predict``)."""
        if self._trainer is None:
            raise RuntimeError(
                f"{type(self).__name__} is not attached to a Trainer yet: pass it "
                "to fit, evaluate or predict in callbacks=[...]"
            )
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Trainer) -> None:
        self._trainer = trainer

    def set_model(self, model: Trainer) -> None:
        """Attaches the Trainer (Keras' name; fit, evaluate and predict call it)."""
        self.trainer = model

    def set_trainer(self, trainer: Trainer) -> None:
        """easyfit's name for ``set_model``."""
        self.set_model(trainer)

    def set_params(self, params: dict[str, Any]) -> None:
        """Run parameters: ``epochs``, ``steps`` (dispatches per epoch), ``verbose``, ..."""
        self.params = params

    @property
    def model(self) -> Trainer:
        """Keras' name for the object being trained (here the Trainer)."""
        return self.trainer

    def on_train_begin(self, logs: Logs | None = None) -> None:
        """Before the first epoch."""

    def on_train_end(self, logs: Logs | None = None) -> None:
        """After the last epoch, also when training stops early or is interrupted."""

    def on_interrupt(self, logs: Logs | None = None) -> None:
        """fit was interrupted (Ctrl-C, or SIGTERM before a preemption) after its last
        completed step; ``on_train_end`` follows, then the KeyboardInterrupt (or
        ``easyfit.errors.Preempted``) reaches the caller."""

    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        """Before each epoch."""

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        """After each epoch, with training and validation metrics."""

    def on_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        """Before each training dispatch (called by ``on_train_batch_begin``)."""

    def on_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """After each training dispatch (called by ``on_train_batch_end``)."""

    def on_train_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        """Before each training dispatch; calls ``on_batch_begin`` unless overridden."""
        self.on_batch_begin(batch, logs=logs)

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """After each training dispatch, with the epoch's running metrics; calls
        ``on_batch_end`` unless overridden."""
        self.on_batch_end(batch, logs=logs)

    def on_test_begin(self, logs: Logs | None = None) -> None:
        """Before evaluation (also the validation inside fit)."""

    def on_test_end(self, logs: Logs | None = None) -> None:
        """After evaluation, with its metrics."""

    def on_test_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        """Before each evaluation dispatch."""

    def on_test_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """After each evaluation dispatch, with the running metrics of the evaluation."""

    def on_predict_begin(self, logs: Logs | None = None) -> None:
        """Before prediction."""

    def on_predict_end(self, logs: Logs | None = None) -> None:
        """After prediction."""

    def on_predict_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        """Before each prediction dispatch."""

    def on_predict_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """After each prediction dispatch, with ``{"outputs": ...}``: its predictions (NumPy,
        padding rows dropped)."""
