"""Fit's epochs, :class:`EpochLoop`, and each epoch's input wait: now in
``easyfit.training.fit_loop`` beside the first step that starts their stream; this module keeps
the old import path working."""

from .fit_loop import INPUT_BOUND, EpochInputWait, EpochLoop

__all__ = ["INPUT_BOUND", "EpochInputWait", "EpochLoop"]
