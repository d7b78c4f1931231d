"""Am I input-bound? The share of an epoch the devices spent waiting for the input pipeline.

``fit`` dispatches each step asynchronously, so when the devices outpace DALI the training
thread waits in the loader's ``__next__`` for the next chunk, and when DALI outpaces the devices
it waits in the dispatch instead. The time spent in ``__next__`` (``Loader.waited``) over the
epoch's training time is therefore the share of the epoch the devices waited for input: the
``input_wait`` of the epoch logs. Above :data:`INPUT_BOUND`, fit says so once, on a line of its
own after the epoch's metrics, for the first epoch whose input comes as in every later one: the
first, or the second with the device cache, whose first epoch streams the data while recording
it (its wait says nothing of the epochs that read the cache).
"""

from __future__ import annotations

import time
from typing import Any

from .._links import docs_url

__all__ = ["INPUT_BOUND", "EpochInputWait"]

#: The share of an epoch spent waiting for input above which fit calls training input-bound.
INPUT_BOUND = 0.25


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
            >>> from easyfit.training.input_wait import EpochInputWait
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
