"""Calls a list of callbacks; skips hooks nobody overrides."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from .callback import Callback, TrainerLike
from .history import History
from .progbar import ProgbarLogger

__all__ = ["CallbackList", "LazyLogs", "as_list", "fit_callbacks"]

#: Keras' older batch hooks, called by the default ``on_train_batch_*``.
_ALIASES = {"on_train_batch_begin": "on_batch_begin", "on_train_batch_end": "on_batch_end"}


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


class LazyLogs(Mapping):
    """Logs computed on first read (reading them syncs the host with the device)."""

    def __init__(self, compute: Callable[[], dict[str, float]]):
        self._compute = compute
        self._logs: dict[str, float] | None = None

    def _get(self) -> dict[str, float]:
        if self._logs is None:
            self._logs = self._compute()
        return self._logs

    def __getitem__(self, key: str) -> float:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return repr(self._get())


def _overrides(cb: Callback, hook: str) -> bool:
    method = getattr(cb, hook)
    return getattr(method, "__func__", method) is not getattr(Callback, hook)


def _listens(cb: Callback, hook: str) -> bool:
    """Whether ``cb`` overrides ``hook``, or the older hook that Callback's ``hook`` calls."""
    return _overrides(cb, hook) or (hook in _ALIASES and _overrides(cb, _ALIASES[hook]))


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


def _invoke(cb: Callback, hook: str, args: tuple[Any, ...], logs: Mapping[str, Any] | None) -> None:
    logs = {} if logs is None else logs
    if "batch" in hook:
        getattr(cb, hook)(*args, logs=logs)
    else:
        getattr(cb, hook)(*args, logs)


class CallbackList:
    """Dispatches each hook to the callbacks that override it, in order."""

    def __init__(self, callbacks: Iterable[Callback], trainer: TrainerLike, params: dict[str, Any]):
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"callbacks: {cb!r} is not an easyfit.callbacks.Callback")
            cb.set_model(trainer)
            cb.set_params(params)
        self._by_hook: dict[str, list[Callback]] = {}

    def wants(self, hook: str) -> bool:
        """Whether any callback overrides ``hook`` (else the caller can skip building logs)."""
        return bool(self._listeners(hook))

    def _listeners(self, hook: str) -> list[Callback]:
        if hook not in self._by_hook:
            self._by_hook[hook] = [cb for cb in self.callbacks if _listens(cb, hook)]
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
