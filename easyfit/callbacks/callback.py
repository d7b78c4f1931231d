"""The callback base class, with Keras' hook names."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..core.state import TrainState
    from ..persistence.checkpoint import Progress, ResumePoint
    from .callback_list import CallbackList

__all__ = ["Callback", "Resumable", "TrainerLike"]

Logs = Mapping[str, Any]

#: Keras' older batch hooks, called by the default ``on_train_batch_*``.
_ALIASES = {"on_train_batch_begin": "on_batch_begin", "on_train_batch_end": "on_batch_end"}


class TrainerLike(Protocol):
    """What a callback may use of the trainer it is attached to (``easyfit.Trainer`` is one):
    callbacks sit below the trainer, so they know it by this much and no more.

    ``state`` (read, and replaced by callbacks that change the weights or the learning rate),
    the ``stop_*`` flags, ``history`` (the latest run's, set by ``History``), where the fit
    stands (``progress``) and what a checkpoint records (``checkpoint_meta``), a metric's
    direction (for ``mode="auto"``), and ``save``.
    """

    state: TrainState | None
    history: Any  # the latest run's History (set by it)
    stop_training: bool
    stop_evaluating: bool
    stop_predicting: bool

    @property
    def progress(self) -> Progress | None: ...

    @property
    def checkpoint_meta(self) -> dict[str, Any]: ...

    def metric_direction(self, name: str) -> str | None: ...

    def save(
        self, path: str | os.PathLike, *, weights_only: bool = False, adapters_only: bool = False
    ) -> str: ...


@runtime_checkable
class Resumable(Protocol):
    """The resume protocol: a callback that can resume a fit (``BackupAndRestore``).

    ``fit`` asks each callback that implements this protocol for a ``ResumePoint`` before it
    builds the training loader (the first one offered wins), and calls ``fit_completed()`` once
    fit returned normally (every ``on_train_end`` ran without an error): a backup may then go.
    """

    def restore_point(self) -> ResumePoint | None:
        """Where the fit should resume, or None to start afresh."""
        ...

    def fit_completed(self) -> None:
        """fit returned normally."""
        ...


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

    A callback that keeps state across epochs (counters, a best value) keeps it through a
    backup too by returning it from ``get_state`` as plain JSON values and taking it back in
    ``set_state``: ``BackupAndRestore`` records it in every backup and a resumed fit puts it
    back (see [Keeping a callback's state through a backup](
    callbacks.md#keeping-a-callbacks-state-through-a-backup)).

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

    #: The CallbackList running this callback (set by it): the running fit's facts that a
    #: built-in callback reads (the callbacks' states for a backup, an epoch left unvalidated).
    _callbacks: CallbackList | None = None

    def __init__(self) -> None:
        self._trainer: TrainerLike | None = None
        self.params: dict[str, Any] = {}

    def _implements(self, hook: str) -> bool:
        """Whether ``hook`` is to be called (the CallbackList asks once per hook): whether this
        callback overrides it (an instance's own function counts), or the older hook that
        Callback's ``hook`` calls. A built-in callback whose batch hooks serve only some of its
        settings (``save_freq``, ``update_freq``) overrides this: in the others they cost
        nothing."""
        return _overrides(self, hook) or (hook in _ALIASES and _overrides(self, _ALIASES[hook]))

    @property
    def trainer(self) -> TrainerLike:
        """The Trainer running this callback (set by ``fit``, ``evaluate`` and ``predict``)."""
        if self._trainer is None:
            raise RuntimeError(
                f"{type(self).__name__} is not attached to a Trainer yet: pass it "
                "to fit, evaluate or predict in callbacks=[...]"
            )
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: TrainerLike) -> None:
        self._trainer = trainer

    def set_model(self, model: TrainerLike) -> None:
        """Attaches the Trainer (Keras' name; fit, evaluate and predict call it)."""
        self.trainer = model

    def set_trainer(self, trainer: TrainerLike) -> None:
        """easyfit's name for ``set_model``."""
        self.set_model(trainer)

    def set_params(self, params: dict[str, Any]) -> None:
        """Run parameters: ``epochs``, ``steps`` (dispatches per epoch), ``verbose``, ..."""
        self.params = params

    @property
    def model(self) -> TrainerLike:
        """Keras' name for the object being trained (here the Trainer)."""
        return self.trainer

    def get_state(self) -> Any:
        """What this callback must keep through a backup, as plain JSON values (dicts with
        string keys, lists, strings, numbers, booleans, None); None (the default) for nothing.

        ``BackupAndRestore`` records it in every backup, after every callback's hooks of that
        batch or epoch end ran, and a fit resumed from the backup gives it to ``set_state``.
        """
        return None

    def set_state(self, state: Any) -> None:
        """Puts back what ``get_state`` returned, in a fit resumed from a backup: called after
        ``on_train_begin`` (which starts the callback afresh) and, when the backup was taken
        in the middle of an epoch, again after that epoch's ``on_epoch_begin`` (which then
        runs a second time for the epoch: what it changes is set back).

        Raises:
            NotImplementedError: ``get_state`` is overridden and this is not.
        """
        raise NotImplementedError(
            f"{type(self).__name__} returns a state from get_state() but does not define "
            "set_state(state) to take it back"
        )

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


def _overrides(cb: Callback, hook: str) -> bool:
    method = getattr(cb, hook)
    return getattr(method, "__func__", method) is not getattr(Callback, hook)
