"""BackupAndRestore: training that survives being killed, resumed exactly where it stopped."""

from __future__ import annotations

import os
import shutil
import warnings

import jax
import orbax.checkpoint as ocp

from .._integrity import WriterLock
from ..checkpoint import ResumePoint, checkpoint_args, reader, verify
from ..errors import CheckpointError
from ._monitor import check_freq
from .callback import Callback, Logs

__all__ = ["BackupAndRestore"]


class BackupAndRestore(Callback):
    """Backs the training up in ``backup_dir`` and, when fit starts again with a backup there,
    resumes from it: same epoch, same batch, same samples next, same state.

    A backup holds the whole training state (parameters, optimizer state, step, RNG key), the
    epoch's running metrics and the training loader's position. Sample order is a pure function
    of (seed, data pass), so a run killed at any moment (even with SIGKILL) and started again with
    the same command ends with the same parameters as a run never interrupted, bit for bit on
    CPU. Backups are written by Orbax into a temporary directory and renamed when complete (a
    half-written one is ignored), and asynchronously: training goes on while they are written.
    The two latest are kept: a backup whose arrays or metadata fail their checksums is set
    aside (renamed ``damaged-<step>``) with a warning naming it, and fit resumes from the
    newest intact one. ``<backup_dir>.lock`` keeps a second fit out of the directory while one
    runs: it gets a CheckpointError and touches nothing there.

    fit asks this callback for its ``restore_point`` before building the loader. Starting
    again with other data, batch size, seed, ``steps_per_execution`` or ``steps_per_epoch``
    raises ValueError (the backup would not mean the same samples); delete ``backup_dir`` to
    start afresh.

    On Ctrl-C, a backup of the last completed step is written before the KeyboardInterrupt
    goes through. Other callbacks' own counters (EarlyStopping's patience, ...) are not backed
    up, as in Keras.

    Args:
        backup_dir: where the backup lives (one per training run).
        save_freq: ``"epoch"``: at each epoch's end; an integer: every that many batches
            (dispatches) as well as on Ctrl-C.
        delete_checkpoint: delete ``backup_dir`` when training finishes (not when it is
            interrupted or fails).

    Example:
        >>> from easyfit.callbacks import BackupAndRestore
        >>> backup = BackupAndRestore(DOCS_TMP + "/backup", save_freq=100)
        >>> backup.restore_point() is None  # nothing to resume from yet
        True
    """

    def __init__(
        self, backup_dir: str | os.PathLike, save_freq: str | int = "epoch", delete_checkpoint: bool = True
    ):
        super().__init__()
        self.backup_dir = os.path.abspath(os.fspath(backup_dir))
        self.save_freq = check_freq(save_freq, "save_freq")
        self.delete_checkpoint = delete_checkpoint
        self._manager: ocp.CheckpointManager | None = None
        self._saved: int | None = None
        self._since = 0
        self._interrupted = False
        self._lock = WriterLock(self.backup_dir)
        if self.save_freq != "epoch":
            # on purpose, per instance: CallbackList calls the batch hook only when it is set
            self.on_train_batch_end = self._on_batch_end  # type: ignore[method-assign]

    def _open(self) -> ocp.CheckpointManager:
        if self._manager is None:
            self._lock.acquire()  # before Orbax cleans temporary directories up
            options = ocp.CheckpointManagerOptions(max_to_keep=2, create=True, cleanup_tmp_directories=True)
            self._manager = ocp.CheckpointManager(self.backup_dir, options=options)
        return self._manager

    def _steps(self) -> list[int]:
        names = os.listdir(self.backup_dir) if os.path.isdir(self.backup_dir) else []
        return sorted((int(n) for n in names if n.isdigit()), reverse=True)

    def restore_point(self) -> ResumePoint | None:
        """The newest intact backup, as a ResumePoint for fit; None when there is none.

        Each backup is verified (every array against its checksum) before it is offered; a
        damaged one is renamed ``damaged-<step>`` with a warning, and the next older one tried.
        """
        if not os.path.isdir(self.backup_dir):
            return None
        self._lock.acquire()  # fit's on_train_begin takes it again for the whole run
        try:
            return self._newest_intact()
        finally:
            if self._manager is None:
                self._lock.release()

    def _newest_intact(self) -> ResumePoint | None:
        for step in self._steps():
            where = os.path.join(self.backup_dir, str(step))
            try:
                meta = verify(where)
            except CheckpointError as e:
                message = f"BackupAndRestore: backup {where} is damaged, set aside ({e})"
                warnings.warn(message, RuntimeWarning, stacklevel=2)
                if jax.process_index() == 0:
                    os.rename(where, os.path.join(self.backup_dir, f"damaged-{step}"))
                    print(message, flush=True)
                continue
            self._saved = step
            return ResumePoint(
                epoch=meta["epoch"],
                batch=meta["batch"],
                position=meta["position"],
                meta=meta,
                read=reader(where),
                source=f"{self.backup_dir} (backup {step})",
            )
        return None

    def on_train_begin(self, logs: Logs | None = None) -> None:
        self._since = 0
        self._interrupted = False
        self._lock.acquire()  # held until on_train_end

    def _backup(self) -> None:
        progress = self.trainer.progress
        assert progress is not None  # fit sets it before the first hook
        step = progress.epoch * (self.params["steps"] + 1) + progress.batch  # grows with both
        if step == self._saved:
            return
        args = checkpoint_args(self.trainer.state, progress, self.trainer.checkpoint_meta)
        self._open().save(step, args=args, force=True)
        self._saved = step

    def _on_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        self._since += 1
        if self._since >= self.save_freq:
            self._since = 0
            self._backup()

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        if self.save_freq == "epoch":
            self._backup()

    def on_interrupt(self, logs: Logs | None = None) -> None:
        self._interrupted = True
        self._backup()

    def on_train_end(self, logs: Logs | None = None) -> None:
        if self._manager is not None:
            self._manager.wait_until_finished()
            self._manager.close()
            self._manager = None
        trainer = self._trainer  # None when fit stopped before attaching it (a refused lock)
        progress = None if trainer is None else trainer.progress
        finished = (
            trainer is not None
            and progress is not None
            and (trainer.stop_training or (progress.batch == 0 and progress.epoch >= self.params["epochs"]))
        )
        if self.delete_checkpoint and finished and not self._interrupted:
            self._saved = None
            if jax.process_index() == 0:
                shutil.rmtree(self.backup_dir, ignore_errors=True)
        self._lock.release()
