"""Modules imported on their first use rather than with easyfit: a fit that saves nothing does
not wait for them (Orbax's import is a tenth of easyfit's); and modules imported in a thread
beside work that waits without holding the interpreter lock."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType

__all__ = ["import_beside", "lazy_module"]


def lazy_module(name: str) -> ModuleType:
    """Module ``name``, executed on its first attribute access (``importlib.util.LazyLoader``);
    the module itself when it is already imported.

    Example:
        >>> from easyfit._lazy import lazy_module
        >>> lazy_module("json").dumps([1])
        '[1]'
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def import_beside(*names: str) -> threading.Thread | None:
    """Imports the modules ``names`` in a background thread, started now and returned (None
    when they are all imported already), while the caller goes on to something that waits
    without holding the interpreter lock: on a GPU machine JAX's runtime takes about a second to
    start, in which DALI's import (half a second of Python) can run. A failure is left to the
    caller's own import to raise. A module the caller imports meanwhile waits for the thread's
    import to finish (Python's per-module import locks): never a half-made module.

    Not a daemon: an import cut short by the interpreter's exit could crash it.

    Example:
        >>> from easyfit._lazy import import_beside
        >>> thread = import_beside("json", "csv")
        >>> thread is None or thread.join() is None
        True
    """
    missing = [name for name in names if name not in sys.modules]
    if not missing:
        return None

    def work() -> None:
        for name in missing:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the caller's own import raises it
                pass

    thread = threading.Thread(target=work, name="easyfit-import")
    thread.start()
    return thread
