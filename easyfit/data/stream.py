"""The one interface of everything that yields chunks of global batches: :class:`Stream`.

A streaming :class:`~easyfit.data.loader.Loader`, the
:class:`~easyfit.data.cache.DeviceCache` and a lent
:class:`~easyfit.data.kept_streams.LentStream` all implement it, so the trainer iterates any of
them alike (the role of Keras' ``DataAdapter``; the position plays the part of Grain's
``get_state``, and ``Loader(..., position=...)`` that of ``set_state``).

A stream is infinite: chunk ``i`` belongs to epoch ``i // plan.chunks_per_epoch``.

What a stream is to be is decided once, before it opens, and carried as a
:class:`StreamRequest` (made by :func:`~easyfit.data.loader.stream_request`); how a streaming
loader runs its DALI pipelines is one :class:`LoaderOptions` value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .._lazy import LazyMapping

if TYPE_CHECKING:
    import jax

    from ..parallel import Placement
    from .loader import SourceKind
    from .plan import Plan
    from .sources.base import Source

__all__ = ["LoaderOptions", "Position", "Stream", "StreamRequest"]


@dataclasses.dataclass(frozen=True)
class LoaderOptions:
    """How a streaming loader runs its DALI pipelines.

    Attributes:
        num_threads: DALI threads per pipeline (None: chosen from the cores).
        prefetch: DALI's prefetch queue depth.
        pipelines_per_device: DALI pipelines feeding each GPU, each with its share of the
            device's rows (None: 3 when each GPU has at least 12 cores, 2 from 8, else 1; see
            [Am I input-bound?](performance.md#am-i-input-bound)). On a CPU-only machine:
            pipelines in all (None: 1).
        pipelines: reader pipelines per process on CPUs (reader-driven sources; None: 1).
        threaded: assemble global batches in a background thread, ``ahead`` chunks in advance,
            so that the training thread only dispatches (None: on GPUs, for indexed sources).
        ahead: chunks the background thread may hold ready once training runs (None: 2).
            Before the consumer takes its first chunk it prepares that one alone (the host's
            cores go to the model's tracing and initialisation meanwhile); until it takes its
            second (while the first step compiles), it may run further ahead: up to an epoch,
            within 256 MiB.

    Example:
        >>> from easyfit.data.stream import LoaderOptions
        >>> LoaderOptions.of({"num_threads": 2}).num_threads
        2
    """

    num_threads: int | None = None
    prefetch: int = 2
    pipelines_per_device: int | None = None
    pipelines: int | None = None
    threaded: bool | None = None
    ahead: int | None = None

    @classmethod
    def of(cls, options: LoaderOptions | Mapping[str, Any] | None) -> LoaderOptions:
        """``options`` as a LoaderOptions: itself, or from a mapping of its fields (the
        keyword arguments loaders took before); an unknown key is a TypeError naming it, as an
        unknown keyword argument is."""
        if isinstance(options, LoaderOptions):
            return options
        given = dict(options or {})
        known = {f.name for f in dataclasses.fields(cls)}
        if unknown := sorted(set(given) - known):
            raise TypeError(f"loader options: unknown {unknown}; expected some of {sorted(known)}")
        return cls(**given)


@dataclasses.dataclass(frozen=True, eq=False)
class StreamRequest:
    """What a stream is to be, decided once before it opens: every layer below reads these
    fields and works none of them out again.

    Attributes:
        source: what to read.
        kind: the source's kind (``easyfit.data.loader.kind_of``): who picks the order.
        plan: the plan the stream follows, made for its kind (a reader's pass length added
            when it streams).
        placement: the devices and shardings.
        cached: whether the stream is gathered from the device cache.
        why: the cache decision in a sentence, for the log.
        start: the stream's first chunk (a position's chunk when resuming from one).
        position: the position to resume at (a reader's holds DALI's checkpoints), or None.
        training: apply the source's ``augment`` (training batches only).
        fill: the stream whose one read fills the device cache before the first chunk (a
            reader's pass in the source's order), or None: the stream is not cached, or its
            cache records it while it streams.
    """

    source: Source
    kind: SourceKind
    plan: Plan
    placement: Placement
    cached: bool
    why: str = ""
    start: int = 0
    position: Mapping[str, Any] | None = None
    training: bool = False
    fill: StreamRequest | None = None


@runtime_checkable
class Stream(Protocol):
    """What yields chunks: dicts of ``x``, ``y``, ``mask`` (and ``sample_weight``) jax.Arrays
    of ``plan.steps_per_execution * plan.batch_size`` rows, sharded over the data axis.

    Attributes:
        plan: the plan the stream follows, fixed when it is made.
        iteration: index of the next chunk ``__next__`` returns.
        waited: seconds the consumer has spent in ``__next__`` waiting for input (fit's
            ``input_wait``).
        warmup_epochs: epochs before input comes as in every later one (a device cache's
            filling epoch).
    """

    @property
    def plan(self) -> Plan: ...

    @property
    def iteration(self) -> int: ...

    @property
    def waited(self) -> float: ...

    @property
    def warmup_epochs(self) -> int: ...

    def __iter__(self) -> Iterator[dict[str, jax.Array]]: ...

    def __next__(self) -> dict[str, jax.Array]: ...

    def peek(self) -> dict[str, jax.Array]:
        """The next chunk, without consuming it."""
        ...

    def chunk_spec(self) -> dict[str, Any] | None:
        """The next chunk's shapes, dtypes and shardings (``jax.ShapeDtypeStruct`` leaves, laid
        out as the chunk), known before the chunk is whole: what lets the model initialise and
        the first step compile while the rest of the chunk is read; None when the stream
        cannot tell before the chunk. May wait for the pipelines' first run."""
        ...

    def position(self) -> Mapping[str, Any]:
        """Where the stream stands before its next chunk: JSON-serialisable once read (as a
        dict), to give back as ``position=`` to a stream of the same plan."""
        ...

    def close(self) -> None:
        """Releases the pipelines and device memory the stream holds."""
        ...


class Position(LazyMapping[Any]):
    """A position read only when it is used: ``resolve()`` gives the full position while the
    stream still stands there; once the stream has moved on (or closed) without it having been
    read, it is ``fallback`` (a position that also resumes exactly, at a higher cost).

    Example:
        >>> from easyfit.data.stream import Position
        >>> p = Position(lambda: {"chunk": 3, "dali": ["..."]}, {"chunk": 3})
        >>> dict(p)
        {'chunk': 3, 'dali': ['...']}
        >>> q = Position(lambda: {"chunk": 4, "dali": []}, {"chunk": 4})
        >>> q.expire()
        >>> dict(q)
        {'chunk': 4}
    """

    def __init__(self, resolve: Callable[[], dict[str, Any]], fallback: dict[str, Any]):
        super().__init__(resolve)
        self._fallback = fallback

    @property
    def resolved(self) -> bool:
        return self._value is not None

    def settle(self) -> None:
        """Computes the position now (the stream is about to release what it needs)."""
        self.value()

    def expire(self) -> None:
        """The stream moved on unread: the position becomes ``fallback``."""
        if self._value is None:
            self._value = self._fallback
            self._compute = None
