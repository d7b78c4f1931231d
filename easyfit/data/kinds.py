"""The two kinds of source, by who picks the sample order, and everything that differs by them.

* :data:`FED`, for an :class:`~easyfit.data.sources.base.IndexedSource`: easyfit's
  :class:`~easyfit.data.plan.Plan` picks the order and feeds DALI the samples
  (:mod:`easyfit.data.fed_pipelines`); a position is a chunk index; the device cache records the
  first epoch while it streams.
* :data:`READ`, for a :class:`~easyfit.data.sources.base.ReaderSource`: DALI's reader picks the
  order (:mod:`easyfit.data.reader_pipelines`); a position holds DALI's checkpoints; the device
  cache reads the source once, unshuffled, and then follows the Plan like the other kind.

:func:`kind_of` is the one place that tells the kinds apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, cast

from ..parallel import Placement
from .cache import DeviceCache, OrderedRead, Recording
from .fed_pipelines import FedPipelines
from .plan import Plan
from .reader_pipelines import ReaderPipelines, reader_plan
from .sources.base import IndexedSource, ReaderSource, Source
from .stream import LoaderOptions, Stream, StreamRequest

__all__ = ["FED", "READ", "ReaderKind", "SourceKind", "kind_of"]


class SourceKind:
    """What differs between the kinds of source: building pipelines, filling the device cache,
    resuming. The base describes :data:`FED`; :data:`READ` overrides what differs."""

    #: Whether easyfit's Plan picks the sample order (so samples can be held out and a chunk
    #: can be assembled ahead, in a background thread).
    planned = True
    #: When the device cache is filled (for the log).
    fills = "after the first epoch"

    def plan(self, plan: Plan, placement: Placement, cached: bool, pipelines: int | None = None) -> Plan:
        """The plan a stream of this kind follows: ``plan``, or for a streamed reader the reader
        pass's length added (``pipelines``: reader pipelines per process on CPUs)."""
        return plan

    def pipelines(self, request: StreamRequest, options: LoaderOptions, pool: bool) -> Any:
        """The DALI pipelines of a streaming loader of ``request``, starting at its first chunk
        (``pool``: wait for and refeed each pipeline in its own thread)."""
        return FedPipelines(
            cast(IndexedSource, request.source),
            request.plan,
            request.placement,
            start=request.start,
            num_threads=options.num_threads,
            prefetch=options.prefetch,
            pipelines_per_device=options.pipelines_per_device,
            training=request.training,
            pool=pool,
        )

    def cache(
        self, request: StreamRequest, stream: Callable[[], Stream], options: LoaderOptions
    ) -> DeviceCache:
        """A device cache of ``request``'s source from its first chunk on; ``stream()`` opens
        the streaming loader the cache may record."""
        loader = stream()
        return DeviceCache(request.plan, request.placement, Recording(loader), start=loader.iteration)

    def resume_cache(
        self, cache: bool | str, use: bool, why: str, position: Mapping[str, Any] | None
    ) -> tuple[bool, str]:
        """Whether a fit resumed at ``position`` caches, given ``decide_cache``'s choice
        ``(use, why)``: that choice, since caching does not change this kind's order."""
        return use, why

    def split_refusal(self, source: Source) -> str | None:
        """Why ``validation_split`` cannot hold samples out of ``source``, or None."""
        return None


class ReaderKind(SourceKind):
    """What differs for a :class:`~easyfit.data.sources.base.ReaderSource` (:data:`READ`)."""

    planned = False
    fills = "after one read by its DALI reader"

    def plan(self, plan: Plan, placement: Placement, cached: bool, pipelines: int | None = None) -> Plan:
        if cached:
            return plan
        if plan.shuffle == "batch":
            raise ValueError(
                "shuffle='batch': this source is read by DALI's reader in its own order, so "
                "easyfit cannot permute each batch of it; use shuffle=True (the reader's "
                "shuffle) or False, or cache=True (the cached data follows easyfit's order)"
            )
        return reader_plan(plan, placement, pipelines)

    def pipelines(self, request: StreamRequest, options: LoaderOptions, pool: bool) -> Any:
        return ReaderPipelines(request, options)

    def cache(
        self, request: StreamRequest, stream: Callable[[], Stream], options: LoaderOptions
    ) -> DeviceCache:
        request.source.check()
        whole = dataclasses.replace(request.plan, shuffle=False, epoch_steps=None)  # one pass, in order
        read = dataclasses.replace(
            request,
            plan=reader_plan(whole, request.placement, options.pipelines),
            cached=False,
            start=0,
            position=None,
            training=False,
        )
        read_options = LoaderOptions(num_threads=options.num_threads, pipelines=options.pipelines)
        return DeviceCache(
            request.plan,
            request.placement,
            OrderedRead(lambda: ReaderPipelines(read, read_options)),
            start=request.start,
        )

    def resume_cache(
        self, cache: bool | str, use: bool, why: str, position: Mapping[str, Any] | None
    ) -> tuple[bool, str]:
        """As the backup's fit did, since the reader's order differs with and without the
        cache: ``cache="auto"`` follows a backup written while streaming; any other difference
        is refused."""
        if position is None:
            return use, why
        cached = bool(position.get("cached"))
        if cached == use:
            return use, why
        if cache == "auto" and not cached:
            return False, "resuming a backup written while streaming: streaming from DALI every epoch"
        raise ValueError(
            f"cache={cache!r}: the backup was written {'with' if cached else 'without'} the device "
            f"cache, which orders a DALI reader's samples differently; resume with cache={cached} "
            "(or delete the backup to start afresh)"
        )

    def split_refusal(self, source: Source) -> str | None:
        return (
            f"validation_split: {source.describe()} is read by DALI's reader in its "
            "own order, so easyfit cannot hold samples out of it; give validation "
            "data instead (validation_data=..., or a root/val beside root/train)"
        )


#: Sources fed by easyfit's Plan (:class:`~easyfit.data.sources.base.IndexedSource`).
FED = SourceKind()
#: Sources read by DALI's reader in its own order (:class:`~easyfit.data.sources.base.ReaderSource`).
READ = ReaderKind()


def kind_of(source: Source) -> SourceKind:
    """The kind of ``source``.

    Example:
        >>> import numpy as np, easyfit as ef
        >>> from easyfit.data.kinds import FED, kind_of
        >>> kind_of(ef.data.Arrays(np.zeros((4, 2)), np.arange(4))) is FED
        True
    """
    if isinstance(source, ReaderSource):
        return READ
    if isinstance(source, IndexedSource):
        return FED
    raise TypeError(
        f"source: {source.describe()} is neither an IndexedSource nor a ReaderSource "
        "(see easyfit.data.sources.base)"
    )
