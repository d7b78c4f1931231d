"""WandbLogger: a fit's configuration, metrics and checkpoints in a Weights & Biases run."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ._tracker import Tracker, import_extra
from .model_checkpoint import ModelCheckpoint

__all__ = ["WandbLogger"]


class WandbLogger(Tracker):
    """Logs a fit to Weights & Biases (``pip install "easyfit-flax[wandb]"``).

    At the start of training it records the configuration: what the trainer knows (optimizer,
    batch size, epochs, steps per epoch and per dispatch, precision, seed, devices, input shape,
    the training data's input recipe) and ``config``. At each epoch's end it logs the epoch's
    logs as ``epoch/<key>`` (the metrics, ``val_*``, ``input_wait``, ``learning_rate`` when the
    optimizer exposes it), plotted against ``epoch/epoch``; with an integer ``update_freq`` also
    ``batch/<key>`` (the epoch's running metrics and the learning rate) every that many batches,
    plotted against ``batch/step`` (the optimizer step). Batch metrics are read from the device
    at those batches only. Only process 0 logs.

    A run started before ``fit`` (``wandb.init(...)``) is logged to and left open; otherwise
    each ``fit`` starts a run with ``project``, ``name`` and ``init_kwargs`` and finishes it at
    the end of training (with exit code 1 when fit failed or was interrupted). Offline
    (``mode="offline"`` or ``WANDB_MODE=offline``) the run is written under ``dir`` for a later
    ``wandb sync``.

    Args:
        project: the W&B project (None: W&B's default, ``WANDB_PROJECT``).
        name: the run's display name (None: W&B picks one).
        config: more configuration to record; its keys replace the trainer's.
        update_freq: ``"epoch"``, or log batch metrics every that many batches (dispatches,
            as for every batch hook).
        log_checkpoints: the ``ModelCheckpoint`` of the same fit: each checkpoint it writes is
            logged as an artifact of type ``"model"`` named ``run_<run id>_<directory name>``
            (a directory written again becomes the artifact's next version), after the hook
            that wrote it.
        **init_kwargs: passed to ``wandb.init`` (``dir``, ``mode``, ``entity``, ``tags``,
            ``group``, ...).

    Raises:
        ImportError: wandb is not installed (naming the extra that installs it).

    Example:
        >>> import tempfile
        >>> tmp = tempfile.mkdtemp()
        >>> from easyfit.callbacks import WandbLogger
        >>> logger = WandbLogger(project="mnist", update_freq=100, mode="offline", dir=tmp)
    """

    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        update_freq: str | int = "epoch",
        log_checkpoints: ModelCheckpoint | None = None,
        **init_kwargs: Any,
    ):
        self._wandb = import_extra("wandb", "wandb", "WandbLogger")
        super().__init__(config, update_freq, log_checkpoints)
        self.project = project
        self.name = name
        self.init_kwargs = init_kwargs
        self.run: Any = None  # the wandb Run being logged to
        self._owns = False

    def _open(self, config: dict[str, Any]) -> None:
        wandb = self._wandb
        if wandb.run is not None:
            self.run, self._owns = wandb.run, False
            self.run.config.update(config, allow_val_change=True)
        else:
            self.run = wandb.init(project=self.project, name=self.name, config=config, **self.init_kwargs)
            self._owns = True
        for axis, prefix in (("epoch/epoch", "epoch/*"), ("batch/step", "batch/*")):
            self.run.define_metric(axis)
            self.run.define_metric(prefix, step_metric=axis)

    def _log(self, metrics: dict[str, float], step: int, epoch: int | None) -> None:
        self.run.log(metrics)

    def _log_checkpoint(self, path: str) -> None:
        name = re.sub(r"[^\w.-]", "-", f"run_{self.run.id}_{os.path.basename(path)}")
        artifact = self._wandb.Artifact(name, type="model", metadata={"path": path})
        artifact.add_dir(path)
        self.run.log_artifact(artifact)

    def _close(self, status: str) -> None:
        if self._owns:
            self.run.finish(exit_code=0 if status == "finished" else 1)
        self.run = None
