"""The two kinds of source, by who picks the sample order, and everything that differs by them.

* :data:`FED`, for an :class:`~easyfit.data.sources.base.IndexedSource`: easyfit's
  :class:`~easyfit.data.plan.Plan` picks the order and feeds DALI the samples
  (:mod:`easyfit.data.fed_pipelines`); a position is a chunk index; the device cache records the
  first epoch while it streams.
* :data:`READ`, for a :class:`~easyfit.data.sources.base.ReaderSource`: DALI's reader picks the
  order (:mod:`easyfit.data.reader_pipelines`); a position holds DALI's checkpoints; the device
  cache reads the source once, unshuffled, and then follows the Plan like the other kind.

:func:`kind_of` is the one place that tells the kinds apart, and :func:`stream_request` the one
place that decides what a stream is to be (its kind, whether it is cached, the plan it follows,
where it starts): every layer below reads the :class:`~easyfit.data.stream.StreamRequest` it
makes and works none of it out again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import numpy as np

from ..parallel import Placement
from .cache import DeviceCache, OrderedRead, Recording, cache_budget
from .pipelines import FedPipelines, ReaderPipelines, reader_plan
from .plan import Plan
from .sources.base import IndexedSource, ReaderSource, Source
from .stream import LoaderOptions, Stream, StreamRequest

__all__ = [
    "FED",
    "READ",
    "ReaderKind",
    "Resume",
    "SourceKind",
    "decide_cache",
    "kind_of",
    "stream_plan",
    "stream_request",
]


class Resume(Protocol):
    """Where a fit resumes (``easyfit.persistence.checkpoint.ResumePoint``): what a training
    stream needs of it."""

    @property
    def epoch(self) -> int: ...

    @property
    def position(self) -> Mapping[str, Any] | None: ...

    def check(self, plan: Plan) -> None: ...


def stream_request(
    source: Source,
    plan: Plan | Callable[[bool], Plan],
    placement: Placement,
    *,
    cache: bool | str,
    options: LoaderOptions,
    training: bool = False,
    initial_epoch: int = 0,
    resume: Resume | None = None,
) -> StreamRequest:
    """What the stream of ``source`` is to be, decided once: its kind, whether it is cached and
    why (:func:`decide_cache`), the plan it follows (``plan``, or ``plan(cached)`` when the
    batching depends on the cache; completed for the kind: :func:`stream_plan`) and where it
    starts: ``resume``'s position (its plan checked against the saved one), else
    ``initial_epoch``'s first chunk. ``training``: the fit's training data (see
    :func:`decide_cache`; augmented)."""
    kind = kind_of(source)
    position = resume.position if resume is not None else None
    cached, why = decide_cache(cache, source, placement, position, training=training, kind=kind)
    batching = plan(cached) if callable(plan) else plan
    followed = kind.plan(batching, placement, cached, options.pipelines)
    if resume is not None:
        resume.check(followed)
        initial_epoch = resume.epoch
    start = int(position["chunk"]) if position is not None else initial_epoch * followed.chunks_per_epoch
    return StreamRequest(source, kind, followed, placement, cached, why, start, position, training)


def decide_cache(
    cache: bool | str,
    source: Source,
    placement: Placement,
    resume: Mapping[str, Any] | None = None,
    *,
    training: bool = True,
    kind: SourceKind | None = None,
) -> tuple[bool, str]:
    """Whether to cache, and why (a sentence for the log): the one decision, for training,
    evaluation and prediction data alike.

    Args:
        cache: fit's ``cache``: ``"auto"``, True or False.
        source: the source (its ``sample_nbytes`` and ``random``).
        placement: the devices.
        resume: the loader position of the backup a fit resumes from, if any (a reader's
            order depends on caching: see ``SourceKind.resume_cache``).
        training: False for evaluation and prediction data, which ``cache=True`` does not
            force: they are cached when they fit (as with ``"auto"``), and never with False.
        kind: ``source``'s kind, when known already.
    """
    kind = kind or kind_of(source)
    if not training and cache is not False:
        cache = "auto"
    use, why = _decide(cache, source, placement, kind)
    return kind.resume_cache(cache, use, why, resume)


def stream_plan(
    source: Source, plan: Plan, placement: Placement, cached: bool, pipelines: int | None = None
) -> Plan:
    """The plan a stream of ``source`` follows, known before it is opened: ``plan``, or for a
    streamed reader-driven source ``plan`` with the reader pass's length
    (:func:`~easyfit.data.reader_pipelines.reader_plan`; ``pipelines``: reader pipelines per
    process on CPUs). :func:`stream_request` makes it as part of a request."""
    return kind_of(source).plan(plan, placement, cached, pipelines)


def _decide(cache: bool | str, source: Source, placement: Placement, kind: SourceKind) -> tuple[bool, str]:
    if cache not in ("auto", True, False):
        raise ValueError(f"cache={cache!r}: expected 'auto', True or False")
    if cache is False:
        return False, "cache=False: streaming from DALI every epoch"
    when = kind.fills
    if source.random:
        if cache is True:
            raise ValueError(
                "cache=True: the training source applies random augmentation, "
                "which must run every epoch; use cache=False or 'auto'"
            )
        return False, "random augmentation must run every epoch: streaming from DALI"
    if source.sample_nbytes is None:
        if cache is True:
            return True, f"cache=True: caching the decoded dataset {when}"
        return False, f"{source.describe()} does not tell its decoded size: streaming from DALI"
    need = source.sample_nbytes * source.num_samples
    budget = _agreed(cache_budget(placement))
    size = f"{_bytes(need)} per device, budget {_bytes(budget)}"
    if need > budget:
        return False, (
            f"the decoded dataset would not fit in device memory ({size}): streaming from DALI every epoch"
        )
    return True, f"caching the decoded dataset on the device {when} ({size})"


def _bytes(n: int) -> str:
    """``n`` bytes in MiB, or in KiB or bytes below one MiB (a small dataset is not "0 MiB").

    Example:
        >>> from easyfit.data.kinds import _bytes
        >>> _bytes(300 * 2**20), _bytes(12_544), _bytes(100)
        ('300 MiB', '12 KiB', '100 B')
    """
    if n >= 2**20:
        return f"{n / 2**20:,.0f} MiB"
    return f"{n / 2**10:,.0f} KiB" if n >= 2**10 else f"{n} B"


def _agreed(budget: int) -> int:
    """Process 0's budget in every process: they must all make the same choice."""
    if jax.process_count() == 1:
        return budget
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int64(budget)))


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
        return FedPipelines(request, options, pool=pool)

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
