"""The batches of a fit's epochs and the facts of each step, in the role of Keras' epoch
iterator and Levanter's ``StepInfo``: fit iterates an epoch's batches, runs the callbacks
around each step and reads back where the fit stands (:meth:`EpochLoop.progress`, the one
place the resume and progress snapshots are built) and the epoch's metrics."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..callbacks.callback_list import LazyLogs
from ..core.metrics import compute_on_host, epoch_logs
from ..persistence.checkpoint import Progress

if TYPE_CHECKING:
    from ..core import steps
    from .first_step import FirstStep

__all__ = ["EpochLoop"]


class EpochLoop:
    """The epochs of one fit over the stream that ``first`` started.

    Args:
        first: the fit's start: its stream, the first chunk and the compilations.
        compiled: the compiled steps.
        empty_metrics: a fresh metric accumulator, placed on the devices.
        batch: the batch the first epoch starts at (a fit resumed mid-epoch).
        metrics: the first epoch's metric accumulator so far (resumed), or None.
    """

    def __init__(
        self,
        first: FirstStep,
        compiled: steps.Compiled,
        empty_metrics: Callable[[], Any],
        *,
        batch: int = 0,
        metrics: Any = None,
    ):
        self.plan = first.stream.plan
        self._first = first
        self._compiled = compiled
        self._empty = empty_metrics
        self._batch = batch
        self.metrics = metrics

    @property
    def mid_epoch(self) -> bool:
        """Whether the coming epoch resumes in its middle."""
        return self._batch > 0

    def batches(self) -> Iterator[tuple[int, Mapping[str, Any]]]:
        """The coming epoch's ``(batch, chunk)``, chunks read as they are asked for."""
        if self.metrics is None:
            self.metrics = self._empty()
        for batch in range(self._batch, self.plan.chunks_per_epoch):
            yield batch, self._first.next_chunk()

    def train(self, state: Any, batch: int, chunk: Mapping[str, Any]) -> Any:
        """Trains ``chunk`` (batch ``batch`` of its epoch) from ``state``; the new state."""
        live = self.plan.live_steps(batch)
        self._first.ready(live)
        state, self.metrics = self._compiled.train(live)(state, self.metrics, chunk)
        return state

    def running_logs(self) -> LazyLogs:
        """The epoch's metrics so far, read from the devices only when read."""
        return LazyLogs(functools.partial(compute_on_host, self.metrics))

    def progress(self, epoch: int, batch: int) -> Progress:
        """Where the fit stands with ``batch`` dispatches of ``epoch`` trained (0: the epoch
        not begun), the epoch's metrics with them."""
        metrics = self.metrics if batch > 0 else None
        return Progress(epoch, batch, self._first.position(), metrics, self.plan)

    def end_epoch(self, state: Any) -> dict[str, float]:
        """The epoch's logs (its metrics, read from the devices); the next epoch starts afresh."""
        logs = epoch_logs(self.metrics, state)
        self.metrics, self._batch = None, 0
        return logs
