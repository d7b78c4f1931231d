"""The batches of a fit's epochs and the facts of each step, in the role of Keras' epoch
iterator and Levanter's ``StepInfo``: fit iterates an epoch's batches, runs the callbacks
around each step and reads back where the fit stands (:meth:`EpochLoop.progress`, the one
place the resume and progress snapshots are built) and the epoch's logs: its metrics and its
``input_wait``.

Am I input-bound? ``fit`` dispatches each step asynchronously, so when the devices outpace DALI
the training thread waits in the loader's ``__next__`` for the next chunk, and when DALI
outpaces the devices it waits in the dispatch instead. The time spent in ``__next__``
(``Loader.waited``) over the epoch's training time is therefore the share of the epoch the
devices waited for input (:class:`EpochInputWait`): the ``input_wait`` of the epoch logs. Above
:data:`INPUT_BOUND`, fit says so once, on a line of its own after the epoch's metrics, for the
first epoch whose input comes as in every later one: the first, or the second with the device
cache, whose first epoch streams the data while recording it (its wait says nothing of the
epochs that read the cache).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .._links import docs_url
from ..callbacks.callback_list import LazyLogs
from ..core.metrics import compute_on_host, epoch_logs
from ..persistence.checkpoint import Progress

if TYPE_CHECKING:
    from ..core import steps
    from .first_step import FirstStep

__all__ = ["INPUT_BOUND", "EpochInputWait", "EpochLoop"]

#: The share of an epoch spent waiting for input above which fit calls training input-bound.
INPUT_BOUND = 0.25


class EpochLoop:
    """The epochs of one fit over the stream that ``first`` started.

    Args:
        first: the fit's start: its stream, the first chunk and the compilations.
        compiled: the compiled steps.
        empty_metrics: a fresh metric accumulator, placed on the devices.
        epoch: the first epoch.
        batch: the batch the first epoch starts at (a fit resumed mid-epoch).
        metrics: the first epoch's metric accumulator so far (resumed), or None.
    """

    def __init__(
        self,
        first: FirstStep,
        compiled: steps.Compiled,
        empty_metrics: Callable[[], Any],
        *,
        epoch: int = 0,
        batch: int = 0,
        metrics: Any = None,
    ):
        self.plan = first.stream.plan
        #: The epoch whose input wait is said (when large): the first whose input comes as in
        #: every later one.
        self._said_epoch = epoch + first.stream.warmup_epochs
        self._waiting: EpochInputWait | None = None
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
        """The coming epoch's ``(batch, chunk)``, chunks read as they are asked for; its input
        wait measured from the first."""
        self._waiting = EpochInputWait(self._first.stream)
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

    def end_epoch(self, state: Any, epoch: int) -> dict[str, float]:
        """Epoch ``epoch``'s logs: its metrics, read from the devices, and its ``input_wait``
        (measured once they are read); the next epoch starts afresh."""
        logs = epoch_logs(self.metrics, state)
        if self._waiting is not None:
            logs["input_wait"] = self._waiting.finish(epoch)
        self.metrics, self._batch = None, 0
        return logs

    def report_input_wait(self, epoch: int) -> None:
        """Prints that training is input-bound, when it is, after ``epoch``'s metrics line (a
        line of its own), for the first epoch whose input comes as in every later one only."""
        if epoch == self._said_epoch and self._waiting is not None:
            self._waiting.report()


class EpochInputWait:
    """Measures one epoch: create it when the epoch starts, read :meth:`share` once the epoch's
    work is done (after its metrics were read from the device)."""

    def __init__(self, loader: Any):
        self.loader = loader
        self.start = time.perf_counter()
        self.waited_before = loader.waited

    def finish(self, epoch: int) -> float:
        """The epoch's share of waiting, measured now; :meth:`report` prints what it means."""
        share, waited, total = self.share()
        self._advice = self.advice(epoch, share, waited, total)
        return share

    def report(self) -> None:
        """Prints :meth:`advice` for the finished epoch, if any (fit calls it after the
        epoch's metrics line, so that it stands on a line of its own)."""
        if getattr(self, "_advice", None):
            print(self._advice, flush=True)

    def share(self) -> tuple[float, float, float]:
        """``(share, seconds waited, seconds of the epoch)``."""
        total = max(time.perf_counter() - self.start, 1e-9)
        waited = max(self.loader.waited - self.waited_before, 0.0)
        return min(waited / total, 1.0), waited, total

    @staticmethod
    def advice(epoch: int, share: float, waited: float, total: float) -> str | None:
        """The line fit prints when the devices waited for input more than :data:`INPUT_BOUND`
        of the epoch, else None.

        Example:
            >>> from easyfit.training.epoch_loop import EpochInputWait
            >>> advice = EpochInputWait.advice(0, 0.62, 1.24, 2.0)
            >>> print(advice.replace("; see ", ";\\n"))
            easyfit: the devices waited for input 62% of epoch 1 (1.2 s of 2.0 s): training is input-bound;
            https://easyfit-flax.readthedocs.io/en/latest/performance/#am-i-input-bound
            >>> EpochInputWait.advice(0, 0.1, 0.2, 2.0) is None
            True
        """
        if share <= INPUT_BOUND:
            return None
        return (
            f"easyfit: the devices waited for input {share:.0%} of epoch {epoch + 1} "
            f"({waited:.1f} s of {total:.1f} s): training is input-bound; see "
            + docs_url("performance.md#am-i-input-bound")
        )
