"""Streams over evaluation and prediction data, kept from one pass over the data to the next.

Each validation pass of a fit, and each ``evaluate`` or ``predict`` on the same source and plan,
reuses one stream: its DALI pipelines are built once, and the stream, infinite like every
stream, starts the next pass exactly where the last one ended. With the device cache allowed,
the data is decoded during the first pass and gathered from device memory afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import jax

from ..parallel import Placement
from .loader import open_stream, stream_request
from .plan import Plan
from .sources.base import Source
from .stream import LoaderOptions, Stream

__all__ = ["KeptStreams", "LentStream"]

T = TypeVar("T")


class KeptStreams:
    """One stream per (source, plan), lent out a pass at a time.

    Args:
        placement: the devices.
        options: how the loaders run (threads, pipelines per device; a mapping of
            :class:`~easyfit.data.stream.LoaderOptions`' fields is taken too).
    """

    def __init__(self, placement: Placement, options: LoaderOptions | Mapping[str, Any] | None = None):
        self.placement = placement
        self.options = LoaderOptions.of(options)
        self._streams: dict[tuple, tuple[Source, Stream]] = {}

    def lease(self, source: Source, plan: Plan, cache: bool | str = "auto", keep: bool = True) -> LentStream:
        """The stream for one pass over ``source`` (use it as a context manager).

        Args:
            cache: the fit's cache choice (see :func:`~easyfit.data.loader.decide_cache`).
            keep: keep the stream for the next pass; False closes it after this one (a plan
                whose next "epoch" would go on with other batches: ``plan.epoch_steps``).
        """
        key = (id(source), plan)
        hit = self._streams.get(key)
        if hit is None or hit[0] is not source:
            request = stream_request(source, plan, self.placement, cache=cache, options=self.options)
            hit = (source, open_stream(request, self.options))
            self._streams[key] = hit
        return LentStream(self._streams, key, hit[1], keep)

    def close(self) -> None:
        """Closes every kept stream: their DALI pipelines and device caches are released."""
        for _, stream in self._streams.values():
            stream.close()
        self._streams.clear()


class _OfTheStream(Generic[T]):
    """A member of a :class:`LentStream` that is its stream's, read at each access."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, lent: LentStream, owner: type | None = None) -> T:
        return getattr(lent.stream, self.name)


class LentStream:
    """A kept stream lent for one pass; dropped if the pass does not complete (the stream would
    no longer start at a pass's first chunk). What it tells of the pass is its stream's."""

    plan = _OfTheStream[Plan]()
    iteration = _OfTheStream[int]()
    waited = _OfTheStream[float]()
    warmup_epochs = _OfTheStream[int]()
    position = _OfTheStream[Callable[[], Mapping[str, Any]]]()
    peek = _OfTheStream[Callable[[], dict[str, jax.Array]]]()

    def __init__(self, streams: dict, key: tuple, stream: Stream, keep: bool = True):
        self._streams = streams
        self._key = key
        self._keep = keep
        self.stream = stream
        self._start = stream.iteration

    def chunk_spec(self) -> dict[str, Any] | None:
        return None  # a kept stream is read from where the last pass left it

    def __iter__(self) -> LentStream:
        return self

    def __next__(self) -> dict[str, jax.Array]:
        return next(self.stream)

    def close(self) -> None:
        """Gives the stream back unfinished: it is dropped and closed."""
        self._streams.pop(self._key, None)
        self.stream.close()

    def __enter__(self) -> LentStream:
        return self

    def __exit__(self, kind, *_):
        done = self.stream.iteration - self._start
        if kind is not None or not self._keep or done % self.stream.plan.chunks_per_epoch:
            self.close()
