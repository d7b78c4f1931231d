"""Am I input-bound? The share of an epoch the devices spent waiting for the input pipeline:
now measured by the epoch loop (``easyfit.training.fit_loop``); this module keeps the old
import path working."""

from .fit_loop import INPUT_BOUND, EpochInputWait

__all__ = ["INPUT_BOUND", "EpochInputWait"]
