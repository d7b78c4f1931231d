"""TerminateOnNaN: stop as soon as the loss is NaN or infinite."""

from __future__ import annotations

import math

from .callback import Callback, Logs

__all__ = ["TerminateOnNaN"]


class TerminateOnNaN(Callback):
    """Stops training when a batch's loss is NaN or infinite (Keras semantics).

    It reads the loss after every dispatch, which waits for the device each time: with
    ``steps_per_execution=k`` that is once every k steps.

    Example:
        >>> from easyfit.callbacks import TerminateOnNaN
        >>> stop = TerminateOnNaN()
    """

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(loss):
            print(f"Batch {batch}: Invalid loss, terminating training", flush=True)
            self.trainer.stop_training = True
