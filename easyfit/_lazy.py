"""Modules imported on their first use rather than with easyfit: a fit that saves nothing does
not wait for them (Orbax's import is a tenth of easyfit's); modules imported while a thread
does work that waits without holding the interpreter lock; and mappings computed on their
first read."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")
V = TypeVar("V")

__all__ = ["LazyMapping", "import_while", "lazy_module"]


_IMPORTING = threading.RLock()


class _LazyModule(ModuleType):
    """Stands for module ``name`` until it is needed: an attribute it lacks is read from the
    module, imported on that first access (under a lock)."""

    def __getattr__(self, attr: str) -> Any:
        module = self.__dict__.get("__easyfit_module__")
        if module is None:  # not imported whole yet: sys.modules may hold it half made
            with _IMPORTING:  # one thread imports; the others wait for the whole module
                module = importlib.import_module(self.__name__)
            self.__dict__["__easyfit_module__"] = module
        return getattr(module, attr)


def lazy_module(name: str) -> ModuleType:
    """Module ``name``, imported on its first attribute access; the module itself when it is
    already imported.

    Safe from several threads at once: the first access imports the module whole (Python's
    import lock, and one of ours around it) before any thread reads an attribute, where
    ``importlib.util.LazyLoader`` (before Python 3.12) let a second thread read a module whose
    code was still running (``module 'orbax.checkpoint' has no attribute 'args'``).

    Raises:
        ModuleNotFoundError: ``name`` is not installed.

    Example:
        >>> from easyfit._lazy import lazy_module
        >>> lazy_module("json").dumps([1])
        '[1]'
    """
    if name in sys.modules:
        return sys.modules[name]
    if importlib.util.find_spec(name) is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return _LazyModule(name)


def import_while(work: Callable[[], T], *names: str) -> T:
    """``work()``, run in a background thread while this thread imports the modules ``names``
    (those not imported yet); its result, or its exception raised here.

    For work that waits without holding the interpreter lock: while JAX's runtime starts on a
    GPU machine (the Trainer's devices), DALI's import, which is mostly Python, can run. The
    import stays in the calling thread, and nothing else runs Python of easyfit's until both
    are done: a package that imports itself circularly, as DALI does, breaks
    when two threads import it at once (Python hands one of them a partially made module). A
    failed import is left to the next ``import`` of the module to raise.

    Example:
        >>> from easyfit._lazy import import_while
        >>> import_while(lambda: 6 * 7, "json")
        42
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as e:  # noqa: BLE001 - raised in the caller
            outcome["error"] = e

    thread = threading.Thread(target=run, name="easyfit-while-importing")
    thread.start()
    try:
        for name in names:
            if name not in sys.modules:
                try:
                    importlib.import_module(name)
                except Exception:  # noqa: BLE001 - the module's next import raises it
                    pass
    finally:
        thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class LazyMapping(Mapping[str, V]):
    """A read-only mapping whose contents are ``compute()``'s, called on the first read only
    (for contents that cost a transfer from the device or a pipeline's checkpoint).

    Example:
        >>> from easyfit._lazy import LazyMapping
        >>> m = LazyMapping(lambda: {"loss": 0.5})
        >>> m["loss"], len(m), m
        (0.5, 1, {'loss': 0.5})
    """

    def __init__(self, compute: Callable[[], dict[str, V]]):
        self._compute: Callable[[], dict[str, V]] | None = compute
        self._value: dict[str, V] | None = None

    def value(self) -> dict[str, V]:
        """The contents as a plain dict (computed on the first call)."""
        if self._value is None:
            assert self._compute is not None
            self._value = self._compute()
            self._compute = None
        return self._value

    def __getitem__(self, key: str) -> V:
        return self.value()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.value())

    def __len__(self) -> int:
        return len(self.value())

    def __repr__(self) -> str:
        return repr(self.value())
