"""Fit's start, :class:`FirstStep`: now in ``easyfit.training.fit_loop`` beside the epoch loop
that goes on with its stream; this module keeps the old import path working."""

from .fit_loop import FirstStep, compile_ahead

__all__ = ["FirstStep", "compile_ahead"]
