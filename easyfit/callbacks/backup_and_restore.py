"""BackupAndRestore: training that survives being killed, resumed exactly where it stopped."""

from __future__ import annotations

import glob
import json
import os
import shutil
import warnings
from typing import TYPE_CHECKING

import jax

from .._files import write_files
from .._lazy import lazy_module
from ..errors import CheckpointError
from ..persistence.checkpoint import ResumePoint, checkpoint_args, reader, verify
from ..persistence.checkpoint_files import WriterLock, owned
from .callback import Callback, Logs
from .periodic import Periodic

if TYPE_CHECKING:
    import orbax.checkpoint as ocp
else:  # imported when a checkpoint is first written or read
    ocp = lazy_module("orbax.checkpoint")

__all__ = ["BackupAndRestore"]


#: The directory inside ``backup_dir`` that holds the backups, and its marker file.
BACKUPS, BACKUPS_MARKER = "easyfit-backups", "EASYFIT_BACKUPS"


class BackupAndRestore(Callback):
    """Backs the training up in ``backup_dir`` and, when fit starts again with a backup there,
    resumes from it: same epoch, same batch, same samples next, same state.

    A backup holds the whole training state (parameters, optimizer state, step, RNG key), the
    epoch's running metrics, the training loader's position and a fingerprint of the training
    data. Sample order is a pure function of (seed, data pass), so a run killed at any moment
    (even with SIGKILL) and started again with the same command ends with the same parameters
    as a run never interrupted, bit for bit on CPU. Backups are written by Orbax into a
    temporary directory and renamed when complete (a half-written one is ignored), and
    asynchronously: training goes on while they are written. A backup whose arrays or metadata
    fail their checksums is set aside (renamed ``damaged-<step>``) with a warning naming it,
    and fit resumes from the newest intact one (with ``double_checkpoint``, the one before).
    ``<backup_dir>.lock`` keeps a second fit out of the directory while one runs: it gets a
    CheckpointError and touches nothing there.

    The backups live in ``backup_dir/easyfit-backups/``, a directory this callback makes and
    marks (the file ``EASYFIT_BACKUPS``); other files in ``backup_dir`` (a config, a CSVLogger
    log) are never touched. Backups an earlier easyfit wrote into ``backup_dir`` itself (known
    by their easyfit metadata) are resumed from, and deleted with the others. When fit returns
    normally, ``delete_checkpoint`` removes that directory, and ``backup_dir`` too if this
    callback made it and it is left empty; a fit that ends in an exception (Ctrl-C, a crash, a
    callback failing in ``on_train_end``) deletes nothing.

    fit asks this callback for its ``restore_point`` before building the loader, and calls
    its ``fit_completed`` once fit returns. Starting again with other data (other files or
    sizes, class names, number of samples), batch size, seed, ``steps_per_execution`` or
    ``steps_per_epoch`` raises ValueError naming what changed (the backup would not mean the
    same samples); delete ``backup_dir/easyfit-backups`` to start afresh.

    On Ctrl-C, a backup of the last completed step is written before the KeyboardInterrupt
    goes through. Unlike Keras, a backup also holds the other callbacks' states
    (``Callback.get_state``: EarlyStopping's patience and best weights, ReduceLROnPlateau's
    counters, ModelCheckpoint's best, CSVLogger's rows, ...), which the resumed fit puts back;
    in the hooks where it backs up (a batch's end, an epoch's end, an interrupt) this callback
    runs after the others, wherever it is listed, so that a backup holds what they did there.
    A fit resumed in the middle of an epoch calls that epoch's ``on_epoch_begin`` again, as it
    was called when the epoch began (the same learning rate), then puts the backup's training
    state and callback states back (see
    [Callbacks](callbacks.md#keeping-a-callbacks-state-through-a-backup)).

    Args:
        backup_dir: where the backups live (one per training run); not empty or None, and
            without ``[``, ``]``, ``*`` or ``?`` (Orbax globs its backups' paths).
        save_freq: ``"epoch"``: at each epoch's end; an integer: every that many batches
            (dispatches) as well as on Ctrl-C.
        double_checkpoint: keep the previous backup as well as the latest, and resume from it
            when the latest is damaged (twice the disk space), as in Keras.
        delete_checkpoint: delete the backups when fit returns normally (not when it is
            interrupted or fails).

    Raises:
        ValueError: ``backup_dir`` is empty, None, holds ``[``, ``]``, ``*`` or ``?``, or is
            a file; or ``save_freq`` is neither ``"epoch"`` nor a positive integer.

    Example:
        >>> import tempfile
        >>> tmp = tempfile.mkdtemp()
        >>> from easyfit.callbacks import BackupAndRestore
        >>> backup = BackupAndRestore(tmp + "/backup", save_freq=100)
        >>> backup.restore_point() is None  # nothing to resume from yet
        True
    """

    def __init__(
        self,
        backup_dir: str | os.PathLike,
        save_freq: str | int = "epoch",
        double_checkpoint: bool = False,
        delete_checkpoint: bool = True,
    ):
        super().__init__()
        if backup_dir is None or not os.fspath(backup_dir).strip():
            raise ValueError(
                f"BackupAndRestore: empty backup_dir ({backup_dir!r}); pass the directory "
                f"to keep the backups in (it must not be the empty string or None)"
            )
        self.backup_dir = os.path.abspath(os.fspath(backup_dir))
        if glob.has_magic(self.backup_dir):
            raise ValueError(
                f"BackupAndRestore: backup_dir {self.backup_dir!r} holds a glob character "
                f"('[', ']', '*' or '?'), which Orbax's backups cannot be written under; "
                f"choose a path without them"
            )
        if os.path.exists(self.backup_dir) and not os.path.isdir(self.backup_dir):
            raise ValueError(f"BackupAndRestore: backup_dir {self.backup_dir!r} is a file; pass a directory")
        self._root = os.path.join(self.backup_dir, BACKUPS)
        self._every = Periodic(save_freq, "save_freq")
        self.save_freq = self._every.every
        self.double_checkpoint = bool(double_checkpoint)
        self.delete_checkpoint = delete_checkpoint
        self._manager: ocp.CheckpointManager | None = None
        self._saved: int | None = None
        self._interrupted = False
        self._lock = WriterLock(self.backup_dir)

    def _implements(self, hook: str) -> bool:
        if hook == "on_train_batch_end":  # only with a save_freq in batches
            return self._every.by_batch
        return super()._implements(hook)

    def _marker(self) -> dict | None:
        """The marker of ``backup_dir/easyfit-backups`` (None when absent); CheckpointError
        when that directory exists without it (not ours: never written to or deleted)."""
        if not os.path.lexists(self._root):
            return None
        try:
            with open(os.path.join(self._root, BACKUPS_MARKER)) as f:
                return dict(json.load(f))
        except (OSError, ValueError, TypeError) as e:
            raise CheckpointError(
                f"BackupAndRestore: {self._root} exists but was not made by easyfit (no "
                f"readable {BACKUPS_MARKER} in it), so it is left as it is; move it away or "
                f"choose another backup_dir"
            ) from e

    def _open(self) -> ocp.CheckpointManager:
        if self._manager is None:
            self._lock.acquire()  # before Orbax cleans temporary directories up
            if self._marker() is None and jax.process_index() == 0:
                made = not os.path.exists(self.backup_dir)
                os.makedirs(self._root)
                marker = {"format": "easyfit-backups", "made_backup_dir": made}
                try:
                    write_files({os.path.join(self._root, BACKUPS_MARKER): json.dumps(marker).encode()})
                except OSError:  # a full disk: not left unmarked, which the next run would refuse
                    os.rmdir(self._root)
                    raise
            keep = 2 if self.double_checkpoint else 1
            options = ocp.CheckpointManagerOptions(
                max_to_keep=keep, create=True, cleanup_tmp_directories=True
            )
            self._manager = ocp.CheckpointManager(self._root, options=options)
        return self._manager

    def _steps(self, folder: str | None = None) -> list[int]:
        folder = folder or self._root
        names = os.listdir(folder) if os.path.isdir(folder) else []
        return sorted((int(n) for n in names if n.isdigit()), reverse=True)

    def _legacy(self) -> list[int]:
        """Backups an easyfit from before ``easyfit-backups/`` wrote into ``backup_dir`` itself
        (known by their easyfit metadata): resumed from, and deleted with the others."""
        return [s for s in self._steps(self.backup_dir) if owned(os.path.join(self.backup_dir, str(s)))]

    def restore_point(self) -> ResumePoint | None:
        """The newest intact backup, as a ResumePoint for fit; None when there is none.

        Each backup is verified (every array against its checksum) before it is offered; a
        damaged one is renamed ``damaged-<step>`` with a warning, and the next older one tried.

        Raises:
            CheckpointError: there were backups but none is intact (the run does not start
                afresh on its own), or ``backup_dir/easyfit-backups`` was not made by easyfit.
        """
        if not os.path.isdir(self.backup_dir):
            return None
        self._lock.acquire()  # fit's on_train_begin takes it again for the whole run
        try:
            if self._marker() is not None:
                return self._newest_intact(self._root)
            return self._newest_intact(self.backup_dir) if self._legacy() else None
        finally:
            if self._manager is None:
                self._lock.release()

    def _newest_intact(self, folder: str) -> ResumePoint | None:
        steps = self._steps(folder) if folder == self._root else self._legacy()
        for step in steps:
            where = os.path.join(folder, str(step))
            try:
                meta = verify(where)
            except CheckpointError as e:
                message = f"BackupAndRestore: backup {where} is damaged, set aside ({e})"
                warnings.warn(message, RuntimeWarning, stacklevel=2)
                if jax.process_index() == 0:
                    os.rename(where, os.path.join(folder, f"damaged-{step}"))
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
        # as Keras, which raises when its backup cannot be loaded: never start afresh
        if steps or any(n.startswith("damaged-") for n in os.listdir(folder)):
            raise CheckpointError(
                f"BackupAndRestore: no intact backup in {folder} (each was damaged and set "
                f"aside as damaged-<step>); delete them to start afresh"
            )
        return None

    def on_train_begin(self, logs: Logs | None = None) -> None:
        self._every.count = 0
        self._interrupted = False
        self._lock.acquire()  # held until on_train_end

    def _backup(self) -> None:
        progress = self.trainer.progress
        assert progress is not None  # fit sets it before the first hook
        step = progress.epoch * (self.params["steps"] + 1) + progress.batch  # grows with both
        if step == self._saved:
            return
        callbacks = self._callbacks  # the fit's callbacks: their states go along
        meta = self.trainer.checkpoint_meta
        arrays = None
        if callbacks is not None:
            meta, arrays = {**meta, "callbacks": callbacks.resume_record()}, callbacks.state_arrays()
        args = checkpoint_args(self.trainer.state, progress, meta, callback_arrays=arrays)
        manager = self._open()
        if not self._intact():
            raise self._gone()
        self._refuse_links()
        try:
            manager.save(step, args=args, force=True)
        except Exception as e:  # Orbax's or TensorStore's own, about a temporary directory
            if not self._intact():
                raise self._gone() from e
            self._refuse_links(e)
            raise
        self._saved = step

    def _refuse_links(self, cause: BaseException | None = None) -> None:
        """Raises CheckpointError naming a backup that is a symbolic link (a step moved away
        and linked back): Orbax, deleting old backups, would stop on it (or, through it, delete
        what it points to), so fit stops first and leaves the link and its target as they are."""
        for name in sorted(os.listdir(self._root)) if os.path.isdir(self._root) else []:
            where = os.path.join(self._root, name)
            if name.isdigit() and os.path.islink(where):
                raise CheckpointError(
                    f"BackupAndRestore: {where} is a symbolic link, not a backup directory; old "
                    f"backups are deleted as new ones are written, and easyfit deletes neither a "
                    f"link nor what it points to, so fit stops and leaves both as they are: move "
                    f"the backup back into {self._root}, or remove the link"
                ) from cause

    def _intact(self) -> bool:
        """Whether the backups' directory still holds its marker (Orbax, writing on, may
        recreate the directory itself after it was deleted)."""
        return os.path.isfile(os.path.join(self._root, BACKUPS_MARKER))

    def _gone(self) -> CheckpointError:
        return CheckpointError(
            f"BackupAndRestore: the backup directory {self._root} was deleted while fit was "
            f"running (by another program?); fit stops rather than train on without a backup. "
            f"Start it again to back up afresh in {self.backup_dir}"
        )

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        if self._every.tick():
            self._backup()

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        if self.save_freq == "epoch":
            self._backup()

    def on_interrupt(self, logs: Logs | None = None) -> None:
        self._interrupted = True
        self._backup()

    def on_train_end(self, logs: Logs | None = None) -> None:
        try:
            if self._manager is not None:
                manager, self._manager = self._manager, None
                try:
                    manager.wait_until_finished()
                finally:
                    manager.close()
        except Exception as e:  # an asynchronous save that failed
            if not self._intact():
                raise self._gone() from e
            self._refuse_links(e)
            raise
        finally:
            self._lock.release()

    def fit_completed(self) -> None:
        """Called by fit once it returns normally (after every ``on_train_end``): with
        ``delete_checkpoint``, removes the backups (``backup_dir/easyfit-backups``, known by
        its marker) and ``backup_dir`` if this callback made it and nothing else is in it."""
        self._saved = None
        if not self.delete_checkpoint or self._interrupted or jax.process_index() != 0:
            return
        try:
            self._lock.acquire()
        except CheckpointError as e:  # another fit took the directory meanwhile: its backups now
            warnings.warn(f"BackupAndRestore: backups kept, {e}", RuntimeWarning, stacklevel=2)
            return
        try:
            for step in self._legacy():
                shutil.rmtree(os.path.join(self.backup_dir, str(step)))
            marker = self._marker()
            if marker is None:
                return
            if os.path.islink(self._root):  # rmtree refuses it; what it points to is not ours
                warnings.warn(
                    f"BackupAndRestore: backups kept, {self._root} is a symbolic link (easyfit "
                    f"deletes neither a link nor what it points to)",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return
            shutil.rmtree(self._root)
            if marker.get("made_backup_dir") and not os.listdir(self.backup_dir):
                os.rmdir(self.backup_dir)
        finally:
            self._lock.release()
