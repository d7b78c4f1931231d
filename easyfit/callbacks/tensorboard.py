"""TensorBoard: scalars in event files that TensorBoard reads, without TensorFlow, and a
``jax.profiler`` trace of chosen batches."""

from __future__ import annotations

import itertools
import os
import warnings
from typing import Any

import jax
import numpy as np

from .callback import Callback, Logs
from .periodic import Periodic

__all__ = ["TensorBoard"]

_WRITERS = itertools.count()


class TensorBoard(Callback):
    """Writes the logs as TensorBoard scalars, laid out as Keras does: ``log_dir/train`` and
    ``log_dir/validation`` (``val_`` keys, prefix dropped), tags ``epoch_<metric>`` at each
    epoch's end (step = epoch) and, with an integer ``update_freq``, ``batch_<metric>`` every
    that many batches (step = the optimizer step; the running metrics of the epoch).

    Event files are written by ``tensorboardX`` (``pip install "easyfit-flax[tensorboard]"``), which
    needs neither TensorFlow nor TensorBoard. Only process 0 writes scalars. Histograms and
    graphs, which Keras' TensorBoard also offers, are not written. Each writer makes a new
    event file (named with the process id and a count, as Keras' are) and only appends to it,
    flushed at each epoch's end: event files already there are never opened, and a write that
    fails (a full disk) raises OSError at that epoch's end, the records before it intact.

    With ``profile_batch``, the training batches from ``start`` to ``stop`` (1-based, counted
    over the epochs of one ``fit``, as Keras counts) are traced by ``jax.profiler`` into
    ``log_dir/train/plugins/profile/<run>/``: ``<host>.xplane.pb`` for TensorBoard's profile
    plugin (``pip install xprof``), ``<host>.trace.json.gz`` and ``perfetto_trace.json.gz`` for
    Perfetto (ui.perfetto.dev). A batch is a dispatch, as for every batch hook: with
    ``steps_per_execution=k`` the trace holds the ``k`` steps of each of those dispatches. The
    trace starts once the dispatches before have finished on the device and stops once the last
    traced one has (the two waits it adds; nothing is waited for when profiling is off), so it
    holds whole dispatches only, with the input pipeline's work between them and any stall
    waiting for input. Every process traces its own host. Another trace already running (a
    ``jax.profiler.trace`` around ``fit``) is left alone, with a warning.

    Args:
        log_dir: the run's directory (``tensorboard --logdir`` it, or a parent).
        update_freq: ``"epoch"``, or write batch-level scalars every that many batches (each
            time reading the metrics from the device).
        profile_batch: ``0`` (default): no trace; ``n``: trace batch ``n``; ``(start, stop)``
            (or ``"start,stop"``, Keras' older form): trace batches ``start`` to ``stop``.
            Batches count from 1; a negative value, ``stop < start``, or a range starting at 0
            is a ValueError.

    Example:
        >>> import tempfile
        >>> tmp = tempfile.mkdtemp()
        >>> from easyfit.callbacks import TensorBoard
        >>> board = TensorBoard(tmp + "/logs", update_freq=50, profile_batch=(10, 12))
        >>> board.profile_batch
        (10, 12)
    """

    def __init__(
        self,
        log_dir: str | os.PathLike = "logs",
        update_freq: str | int = "epoch",
        profile_batch: int | tuple[int, int] | list[int] | str = 0,
    ):
        super().__init__()
        self.log_dir = os.fspath(log_dir)
        self._every = Periodic(update_freq, "update_freq")
        self.update_freq = self._every.every
        self.profile_batch = _profile_range(profile_batch)
        self._writers: dict[str, Any] = {}
        self._batches = 0  # training batches begun in this fit (Keras' global train batch)
        self._tracing = False

    def _implements(self, hook: str) -> bool:
        if hook == "on_train_batch_begin":  # only to profile
            return self.profile_batch is not None
        if hook == "on_train_batch_end":  # to profile, or with an update_freq in batches
            return self._every.by_batch or self.profile_batch is not None
        return super()._implements(hook)

    def _writer(self, split: str) -> Any:
        if split not in self._writers:
            try:
                from tensorboardX import SummaryWriter
            except ImportError as e:
                raise ImportError(
                    'TensorBoard needs tensorboardX: pip install "easyfit-flax[tensorboard]"'
                ) from e
            # a name of its own (tensorboardX's is the second and host): a file already
            # there, another run's or another writer's of this second, is never reopened
            suffix = f".{os.getpid()}.{next(_WRITERS)}"
            self._writers[split] = SummaryWriter(os.path.join(self.log_dir, split), filename_suffix=suffix)
        return self._writers[split]

    def _write(self, prefix: str, logs: Logs, step: int) -> None:
        if jax.process_index() != 0:
            return
        for key, value in logs.items():
            split, name = ("validation", key[4:]) if key.startswith("val_") else ("train", key)
            self._writer(split).add_scalar(f"{prefix}_{name}", float(value), global_step=step)

    def on_train_begin(self, logs: Logs | None = None) -> None:
        self._every.count = 0
        self._batches = 0

    def get_state(self) -> dict[str, Any]:
        """The batch counters (``update_freq``, ``profile_batch``)."""
        return {"since": self._every.count, "batches": self._batches}

    def set_state(self, state: dict[str, Any]) -> None:
        self._every.count, self._batches = state["since"], state["batches"]

    def on_train_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        self._batches += 1
        assert self.profile_batch is not None  # the hook is called only then
        if self._batches == self.profile_batch[0]:
            self._start_trace()

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        if self._tracing and self.profile_batch is not None and self._batches >= self.profile_batch[1]:
            self._stop_trace()
        if self._every.tick():
            state = self.trainer.state
            assert state is not None  # set before the first batch
            self._write("batch", logs or {}, int(np.asarray(state.step)))

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        self._write("epoch", logs or {}, epoch)
        for split, writer in self._writers.items():
            try:
                writer.flush()
            except OSError as e:  # a full disk: fit stops, saying so, rather than log nothing
                raise self._failed(split, e) from e

    def _failed(self, split: str, e: OSError) -> OSError:
        return OSError(
            e.errno,
            f"{os.path.join(self.log_dir, split)}: TensorBoard's event file not written "
            f"({e.strerror or e}); the records written before are intact",
        )

    def on_train_end(self, logs: Logs | None = None) -> None:
        if self._tracing:  # fit ended (stopped, interrupted, failed) inside the traced range
            self._stop_trace()
        elif self.profile_batch is not None and self._batches < self.profile_batch[0]:
            warnings.warn(
                f"TensorBoard(profile_batch={self.profile_batch}): no trace written: this fit "
                f"trained {self._batches} batches",
                UserWarning,
                stacklevel=2,
            )
        writers, self._writers = self._writers, {}
        error: OSError | None = None
        for split, writer in writers.items():
            try:
                writer.close()
            except OSError as e:  # every writer closed all the same; the first error raised
                error = error or self._failed(split, e)
        if error is not None:
            raise error

    def _start_trace(self) -> None:
        jax.block_until_ready(self.trainer.state)  # the dispatches before, out of the trace
        try:
            jax.profiler.start_trace(os.path.join(self.log_dir, "train"), create_perfetto_trace=True)
        except RuntimeError as e:  # only one trace at a time: someone else's is running
            warnings.warn(f"TensorBoard(profile_batch=...): no trace written: {e}", UserWarning, stacklevel=3)
            return
        self._tracing = True

    def _stop_trace(self) -> None:
        self._tracing = False
        jax.block_until_ready(self.trainer.state)  # the traced dispatches, done on the device
        jax.profiler.stop_trace()


def _profile_range(value: Any) -> tuple[int, int] | None:
    """``profile_batch`` as ``(start, stop)``, or None for ``0`` (no trace); ValueError naming
    the argument for anything else than Keras' forms."""
    given = value
    if isinstance(value, str):
        try:
            value = [int(part) for part in value.split(",")]
        except ValueError:
            value = given
        else:
            value = value[0] if len(value) == 1 else value
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        start, stop = value
        if start == stop == 0:
            return None
        if 1 <= start <= stop:
            return (start, stop)
    raise ValueError(
        f"profile_batch={given!r}: expected 0 (no trace), a batch number n >= 1, or a pair "
        "(start, stop) of batch numbers with 1 <= start <= stop (or the string 'start,stop'); "
        "batches count from 1"
    )
