"""The one interface of everything that yields chunks of global batches: :class:`Stream`.

A streaming :class:`~easyfit.data.loader.Loader`, the
:class:`~easyfit.data.cache.DeviceCache` and a lent
:class:`~easyfit.data.kept_streams.LentStream` all implement it, so the trainer iterates any of
them alike (the role of Keras' ``DataAdapter``; the position plays the part of Grain's
``get_state``, and ``Loader(..., position=...)`` that of ``set_state``).

A stream is infinite: chunk ``i`` belongs to epoch ``i // plan.chunks_per_epoch``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import jax

    from .plan import Plan

__all__ = ["Position", "Stream"]


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


class Position(Mapping[str, Any]):
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
        self._resolve: Callable[[], dict[str, Any]] | None = resolve
        self._fallback = fallback
        self._value: dict[str, Any] | None = None

    @property
    def resolved(self) -> bool:
        return self._value is not None

    def value(self) -> dict[str, Any]:
        """The position as a plain dict (computed on the first call)."""
        if self._value is None:
            assert self._resolve is not None
            self._value = self._resolve()
            self._resolve = None
        return self._value

    def settle(self) -> None:
        """Computes the position now (the stream is about to release what it needs)."""
        self.value()

    def expire(self) -> None:
        """The stream moved on unread: the position becomes ``fallback``."""
        if self._value is None:
            self._value = self._fallback
            self._resolve = None

    def __getitem__(self, key: str) -> Any:
        return self.value()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.value())

    def __len__(self) -> int:
        return len(self.value())

    def __repr__(self) -> str:
        return repr(self.value())
