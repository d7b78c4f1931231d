"""TerminateOnNaN: stop as soon as the loss is NaN or infinite."""

from __future__ import annotations

import math

from .callback import Callback, Logs

__all__ = ["TerminateOnNaN"]


class TerminateOnNaN(Callback):
    """Stops training when a batch's loss is NaN or infinite (Keras semantics).

    It reads the loss after every dispatch, which waits for the device each time: with
    ``steps_per_execution=k`` that is once every k steps.

    Args:
        raise_error: False (default): stop gracefully (``stop_training``; the epoch's end
            hooks and ``on_train_end`` run). True: raise RuntimeError at once, naming the batch
            and the loss. Unlike Keras, the other callbacks' ``on_train_end`` still runs (they
            close files and release locks; see [Coming from Keras](keras.md#callbacks)), with the error in
            ``sys.exc_info()``; BackupAndRestore keeps its backup.

    Example:
        >>> from easyfit.callbacks import TerminateOnNaN
        >>> TerminateOnNaN(raise_error=True).on_batch_end(3, {"loss": float("nan")})
        Traceback (most recent call last):
        ...
        RuntimeError: NaN or Inf loss encountered at batch 3. Loss value: nan. ...
    """

    def __init__(self, raise_error: bool = False):
        super().__init__()
        self.raise_error = raise_error

    def on_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        loss = (logs or {}).get("loss")
        if loss is None or math.isfinite(loss):
            return
        if self.raise_error:
            raise RuntimeError(
                f"NaN or Inf loss encountered at batch {batch}. Loss value: {loss}. "
                "Terminating training immediately."
            )
        print(f"Batch {batch}: Invalid loss, terminating training", flush=True)
        self.trainer.stop_training = True
