"""Modules imported on their first use rather than with easyfit: a fit that saves nothing does
not wait for them (Orbax's import is a tenth of easyfit's)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

__all__ = ["lazy_module"]


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
