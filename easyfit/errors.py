"""Errors raised by easyfit."""

from __future__ import annotations

__all__ = ["CheckpointError", "DataError", "Preempted"]


class DataError(ValueError):
    """Bad input data: a missing directory, an empty class folder, an image that cannot be
    decoded, a label outside the model's outputs, ...

    Only for data: a mistake in an argument raises ValueError or TypeError naming the argument,
    and a bad checkpoint directory :class:`CheckpointError`. The message always names the file,
    record or argument at fault and what is wrong with it.

    Example:
        >>> import easyfit as ef
        >>> try:
        ...     ef.data.ImageFolder("/no/such/dir")
        ... except ef.errors.DataError as e:
        ...     print(e)
        /no/such/dir: no such directory
    """


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be restored: missing, unfinished (a save was
    interrupted), not an easyfit checkpoint, or lacking what is needed to restore it.

    The message names the directory.

    Example:
        >>> import easyfit as ef
        >>> try:
        ...     ef.checkpoint.read_metadata("/no/such/ckpt")
        ... except ef.errors.CheckpointError as e:
        ...     print(e)
        /no/such/ckpt: no such checkpoint directory
    """


class Preempted(SystemExit):
    """``fit`` stopped on SIGTERM, the signal job schedulers send before they preempt a job.

    fit finishes the step in progress, lets the callbacks write their backups
    (``BackupAndRestore``) and run ``on_train_end``, then raises this. It is a SystemExit with
    the status a process killed by SIGTERM has (143), so a script that does not catch it exits
    as the scheduler expects; run it again to resume from the backup.
    """

    def __init__(self) -> None:
        super().__init__(143)
