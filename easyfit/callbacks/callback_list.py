"""Calls a list of callbacks; skips hooks nobody overrides."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from .._lazy import LazyMapping
from ..core.learning_rate import get_learning_rate, set_learning_rate
from .callback import Callback, Resumable, TrainerLike
from .history import History
from .progbar import ProgbarLogger

if TYPE_CHECKING:
    from ..persistence.checkpoint import ResumePoint

__all__ = ["CallbackList", "LazyLogs", "as_list", "fit_callbacks", "fit_completed", "resume_point"]

#: The hooks in which a backup is written: callbacks that back the fit up (``Resumable`` ones:
#: ``BackupAndRestore``) run last in them, wherever they are listed, so that a backup
#: holds what every other callback did at that batch or epoch end (a learning rate just
#: reduced, a patience counter).
_BACKUP_HOOKS = ("on_train_batch_end", "on_epoch_end", "on_interrupt")


def as_list(callbacks: Any) -> list[Callback]:
    """``callbacks`` as a list, read once: None, one Callback (wrapped, as Keras does), or any
    iterable of them (a list, a tuple, a generator); else TypeError naming the argument."""
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback):
        return [callbacks]
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
        raise TypeError(f"callbacks={callbacks!r}: expected an easyfit.callbacks.Callback or a list of them")
    return list(callbacks)


class LazyLogs(LazyMapping[float]):
    """Logs computed on first read (reading them syncs the host with the device)."""


def fit_callbacks(callbacks: Iterable[Callback] | None, verbose: int) -> tuple[list[Callback], History]:
    """fit's callbacks, as Keras lists them: the user's, then a History and (with ``verbose``)
    a ProgbarLogger, each unless the user's list holds one already. History runs after the
    user's callbacks, so keys they add to the epoch logs reach it; the History is the one
    ``fit`` returns.

    Example:
        >>> from easyfit.callbacks import Callback
        >>> mine = Callback()
        >>> listed, history = fit_callbacks([mine], verbose=0)
        >>> listed[0] is mine, listed[1] is history
        (True, True)
    """
    listed = list(callbacks or [])
    history = next((cb for cb in listed if isinstance(cb, History)), None)
    if history is None:
        history = History()
        listed.append(history)
    if verbose and not any(isinstance(cb, ProgbarLogger) for cb in listed):
        listed.append(ProgbarLogger(verbose))
    return listed, history


def _backs_up(cb: Any) -> bool:
    return isinstance(cb, Resumable)


def resume_point(callbacks: Iterable[Any]) -> tuple[ResumePoint | None, bool]:
    """The first ``ResumePoint`` that a ``Resumable`` of ``callbacks`` offers (None when none
    does), and whether any of them backs the fit up."""
    resumable = [cb for cb in callbacks if _backs_up(cb)]
    for cb in resumable:
        point = cb.restore_point()
        if point is not None:
            return point, True
    return None, bool(resumable)


def fit_completed(callbacks: Iterable[Any]) -> None:
    """Tells each ``Resumable`` of ``callbacks`` that fit returned normally (every
    ``on_train_end`` ran without an error): a backup may now go."""
    for cb in callbacks:
        if _backs_up(cb):
            cb.fit_completed()


def _keys(callbacks: list[Callback]) -> list[str]:
    """Each callback's name in a backup: its class's, ``#2``, ``#3``, ... for the next ones of
    the same class (the same command lists them in the same order)."""
    seen: Counter[str] = Counter()
    keys = []
    for cb in callbacks:
        name = type(cb).__name__
        seen[name] += 1
        keys.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return keys


def _warn(message: str) -> None:
    warnings.warn(f"BackupAndRestore: {message}", UserWarning, stacklevel=4)


def _invoke(cb: Callback, hook: str, args: tuple[Any, ...], logs: Mapping[str, Any] | None) -> None:
    logs = {} if logs is None else logs
    if "batch" in hook:
        getattr(cb, hook)(*args, logs=logs)
    else:
        getattr(cb, hook)(*args, logs)


class CallbackList:
    """Dispatches each hook to the callbacks that override it, in order (backups last in the
    hooks that write them); keeps the callbacks' states through a backup."""

    def __init__(self, callbacks: Iterable[Callback], trainer: TrainerLike, params: dict[str, Any]):
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"callbacks: {cb!r} is not an easyfit.callbacks.Callback")
            cb.set_model(trainer)
            cb.set_params(params)
            cb._callbacks = self
        self._by_hook: dict[str, list[Callback]] = {}
        self._trainer = trainer
        self._keys = _keys(self.callbacks)
        self._backed_up = any(_backs_up(cb) for cb in self.callbacks)
        self._epoch_rate: float | None = None  # the learning rate as the epoch in progress began
        self._restored: dict[str, Any] = {}  # the states a resumed fit put back
        self._restored_arrays: dict[str, Any] = {}
        #: The epoch ending now was not validated, on purpose (``validation_freq``): set by fit.
        self.validation_skipped = False

    def wants(self, hook: str) -> bool:
        """Whether any callback overrides ``hook`` (else the caller can skip building logs)."""
        return bool(self._listeners(hook))

    def _listeners(self, hook: str) -> list[Callback]:
        if hook not in self._by_hook:
            listening = [cb for cb in self.callbacks if cb._implements(hook)]
            if hook in _BACKUP_HOOKS:
                listening.sort(key=_backs_up)  # stable: the others in their order, backups last
            self._by_hook[hook] = listening
        return self._by_hook[hook]

    def call(self, hook: str, *args: Any, logs: Mapping[str, Any] | None = None) -> None:
        """Calls ``hook`` of each callback that listens, with ``logs`` (``{}`` when None, as
        Keras): by keyword for the batch hooks, by position for the others, as Keras does."""
        for cb in self._listeners(hook):
            _invoke(cb, hook, args, logs)

    def call_all(self, hook: str, *args: Any, logs: Mapping[str, Any] | None = None) -> None:
        """As :meth:`call`, but every listener runs even when one raises (a hook that lets go
        of resources: ``on_train_end``); the first exception is raised after the last one."""
        error: BaseException | None = None
        for cb in self._listeners(hook):
            try:
                _invoke(cb, hook, args, logs)
            except BaseException as e:  # noqa: BLE001 - raised below, once all have run
                error = error or e
        if error is not None:
            raise error

    # ------------------------------------------------------- the callbacks' states in a backup
    def resume_record(self) -> dict[str, Any]:
        """What a backup records of the callbacks: each one's ``get_state()`` (those not None),
        by name, the names of those with arrays too (see :meth:`state_arrays`), and the
        learning rate as the epoch in progress began (what its ``on_epoch_begin`` saw).

        Raises:
            TypeError: a ``get_state()`` returned what JSON cannot hold, naming the callback.
        """
        states = {}
        for key, cb in zip(self._keys, self.callbacks, strict=True):
            state = cb.get_state()
            if state is None:
                continue
            try:  # as a resumed fit reads it back (a tuple a list): the same in this process
                states[key] = json.loads(json.dumps(state))
            except (TypeError, ValueError) as e:
                raise TypeError(
                    f"{key}.get_state() must return plain JSON values (dicts with string keys, "
                    f"lists, strings, numbers, booleans, None) for a backup to keep them: {e}"
                ) from e
        return {
            "states": states,
            "arrays": sorted(self.state_arrays()),
            "epoch_start_learning_rate": self._epoch_rate,
        }

    def state_arrays(self) -> dict[str, Any]:
        """The arrays built-in callbacks keep beside their JSON state (``EarlyStopping``'s best
        weights), by name: a private protocol (``_state_arrays``, ``_set_state_arrays``)."""
        found = {}
        for key, cb in zip(self._keys, self.callbacks, strict=True):
            arrays = getattr(cb, "_state_arrays", None)
            tree = arrays() if callable(arrays) else None
            if tree is not None:
                found[key] = tree
        return found

    def restore(self, resume: ResumePoint) -> None:
        """Puts the callbacks' states of the backup ``resume`` back (after ``on_train_begin``),
        warning about a state no callback of this fit takes and a callback with a state the
        backup lacks (it starts afresh)."""
        record = resume.meta.get("callbacks")
        listed = zip(self._keys, self.callbacks, strict=True)
        stateful = [key for key, cb in listed if cb.get_state() is not None]
        if not isinstance(record, dict):
            if stateful:
                _warn(
                    f"{resume.source} records no callback states (written by an older easyfit): "
                    f"{', '.join(stateful)} start afresh"
                )
            return
        saved = dict(record.get("states") or {})
        if missing := [key for key in saved if key not in self._keys]:
            _warn(
                f"{resume.source} holds the state of {', '.join(missing)}, which this fit's "
                f"callbacks lack: not restored (pass the callbacks the backed-up fit had, in "
                f"the same order)"
            )
        if fresh := [key for key in stateful if key not in saved]:
            _warn(f"{resume.source} holds no state for {', '.join(fresh)}: started afresh")
        self._restored = {key: state for key, state in saved.items() if key in self._keys}
        by_key = dict(zip(self._keys, self.callbacks, strict=True))
        named = [key for key in record.get("arrays") or [] if key in by_key]
        like = {key: cast(Any, by_key[key])._state_arrays_like() for key in named}
        self._restored_arrays = resume.read_item("callback_arrays", like) if like else {}
        self._epoch_rate = record.get("epoch_start_learning_rate")
        self._put_back()

    def _put_back(self) -> None:
        for key, cb in zip(self._keys, self.callbacks, strict=True):
            if key in self._restored:
                cb.set_state(self._restored[key])
            if key in self._restored_arrays:
                cast(Any, cb)._set_state_arrays(self._restored_arrays[key])

    def begin_epoch(self, epoch: int, resumed: bool = False) -> None:
        """Calls ``on_epoch_begin``. With ``resumed`` (a fit resumed in the middle of
        ``epoch``) it runs again as it ran when the epoch began, seeing the learning rate the
        epoch began with; then the training state (the backup's) and the callbacks' restored
        states are put back, so that nothing it changes counts twice."""
        trainer = self._trainer
        if not resumed:
            if self._backed_up and self.wants("on_epoch_begin"):
                assert trainer.state is not None  # fit made it before the first epoch
                self._epoch_rate = get_learning_rate(trainer.state.opt_state)
            self.call("on_epoch_begin", epoch)
            return
        restored = trainer.state
        assert restored is not None  # the backup's, restored before the resumed epoch
        if self._epoch_rate is not None and self.wants("on_epoch_begin"):
            try:
                trainer.state = restored.replace(
                    opt_state=set_learning_rate(restored.opt_state, self._epoch_rate)
                )
            except (TypeError, ValueError):  # a schedule's rate, or none: nothing to set back
                pass
        try:
            self.call("on_epoch_begin", epoch)
        finally:
            trainer.state = restored
        self._put_back()
