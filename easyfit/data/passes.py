"""Loaders for whole passes over evaluation and prediction data, kept from one pass to the next.

Each validation pass of a fit, and each ``evaluate`` or ``predict`` on the same source and plan,
reuses one loader: its DALI pipelines are built once, and its stream, infinite like every
loader's, starts the next pass exactly where the last one ended. With the device cache allowed,
the data is decoded during the first pass and gathered from device memory afterwards.
"""

from __future__ import annotations

from typing import Any

from ..parallel import Placement
from .cache import CachedLoader, decide_cache
from .loader import Loader
from .plan import Plan
from .reader_cache import ReaderCache
from .sources.base import ReaderSource, Source

__all__ = ["PassLoaders"]


class PassLoaders:
    """One loader per (source, plan), lent out a pass at a time.

    Args:
        placement: the devices.
        options: keyword arguments for the loaders (threads, pipelines per device).
    """

    def __init__(self, placement: Placement, options: dict[str, Any]):
        self.placement = placement
        self.options = options
        self._loaders: dict[tuple, tuple[Source, Any]] = {}

    def lease(self, source: Source, plan: Plan, cache: bool | str = "auto", keep: bool = True) -> Lease:
        """The loader for one pass over ``source`` (use it as a context manager).

        Args:
            cache: the fit's cache choice: ``False`` keeps streaming; otherwise the data is
                cached when :func:`decide_cache` says it fits.
            keep: keep the loader for the next pass; False closes it after this one (a plan
                whose next "epoch" would go on with other batches: ``plan.epoch_steps``).
        """
        key = (id(source), plan)
        hit = self._loaders.get(key)
        if hit is None or hit[0] is not source:
            loader: Any
            if not decide_cache("auto" if cache is not False else False, source, self.placement)[0]:
                loader = Loader(source, plan, self.placement, **self.options)
            elif isinstance(source, ReaderSource):  # read once, then in the source's own order
                loader = ReaderCache(source, plan, self.placement, **self.options)
            else:
                loader = CachedLoader(Loader(source, plan, self.placement, **self.options))
            hit = (source, loader)
            self._loaders[key] = hit
        return Lease(self._loaders, key, hit[1], keep)

    def close(self) -> None:
        """Closes every kept loader: their DALI pipelines and device caches are released."""
        for _, loader in self._loaders.values():
            loader.close()
        self._loaders.clear()


class Lease:
    """A kept loader for one pass; dropped if the pass does not complete (its stream would no
    longer start at a pass's first chunk)."""

    def __init__(self, loaders: dict, key: tuple, loader: Any, keep: bool = True):
        self._loaders = loaders
        self._key = key
        self._keep = keep
        self.loader = loader
        self.peek = loader.peek
        self._start = loader.iteration

    @property
    def plan(self) -> Plan:
        return self.loader.plan

    def __next__(self) -> dict:
        return next(self.loader)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, kind, *_):
        done = self.loader.iteration - self._start
        if kind is not None or not self._keep or done % self.loader.plan.chunks_per_epoch:
            self._loaders.pop(self._key, None)
            self.loader.close()
