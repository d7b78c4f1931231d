"""Am I input-bound? The share of an epoch the devices spent waiting for the input pipeline.

``fit`` dispatches each step asynchronously, so when the devices outpace DALI the training
thread waits in the loader's ``__next__`` for the next chunk, and when DALI outpaces the devices
it waits in the dispatch instead. The time spent in ``__next__`` (``Loader.waited``) over the
epoch's training time is therefore the share of the epoch the devices waited for input: the
``input_wait`` of the epoch logs. Above :data:`INPUT_BOUND`, fit says so after the first epoch
(after the second with the device cache, whose first epoch streams the data while recording it).
"""

from __future__ import annotations

import time
from typing import Any

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

    def finish(self, epoch: int, report: bool) -> float:
        """The epoch's share of waiting; with ``report``, prints :meth:`advice` if any."""
        share, waited, total = self.share()
        advice = self.advice(epoch, share, waited, total)
        if report and advice:
            print(advice, flush=True)
        return share

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
            >>> print(EpochInputWait.advice(0, 0.62, 1.24, 2.0))
            easyfit: the devices waited for input 62% of epoch 1 (1.2 s of 2.0 s): training is ...
            >>> EpochInputWait.advice(0, 0.1, 0.2, 2.0) is None
            True
        """
        if share <= INPUT_BOUND:
            return None
        return (
            f"easyfit: the devices waited for input {share:.0%} of epoch {epoch + 1} "
            f"({waited:.1f} s of {total:.1f} s): training is input-bound; see "
            "docs/performance.md#am-i-input-bound"
        )
