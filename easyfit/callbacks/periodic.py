"""Every N batches, in one place: the counter behind ``save_freq`` and ``update_freq`` (in the
spirit of CLU's ``PeriodicAction``)."""

from __future__ import annotations

from typing import Any

__all__ = ["Periodic", "check_freq"]


def check_freq(value: Any, argument: str) -> Any:
    """``"epoch"`` or a positive int (batches), else ValueError naming ``argument``."""
    if value == "epoch" or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise ValueError(f"{argument}={value!r}: expected 'epoch' or a positive number of batches")


class Periodic:
    """Says when an action every ``every`` batches is due: ``tick()`` counts a batch and is
    True on every ``every``-th; with ``"epoch"``, it is never due (the action runs at epochs'
    ends). ``count``, the batches since the last time it was due, is what a callback keeps
    through a backup.

    Example:
        >>> from easyfit.callbacks.periodic import Periodic
        >>> every = Periodic(3, "save_freq")
        >>> [every.tick() for _ in range(7)], every.count
        ([False, False, True, False, False, True, False], 1)
    """

    def __init__(self, every: str | int, argument: str):
        self.every = check_freq(every, argument)
        self.count = 0

    @property
    def by_batch(self) -> bool:
        """Whether the action runs every that many batches (not at epochs' ends)."""
        return self.every != "epoch"

    def tick(self) -> bool:
        """Counts a batch; True when the action is due now."""
        if self.every == "epoch":
            return False
        self.count += 1
        if self.count < self.every:
            return False
        self.count = 0
        return True
