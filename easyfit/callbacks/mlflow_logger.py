"""MLflowLogger: a fit's configuration, metrics and checkpoints in an MLflow run."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

from ._tracker import Tracker, import_extra
from .model_checkpoint import ModelCheckpoint

__all__ = ["MLflowLogger"]

_STATUS = {"finished": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}
_BATCH = 100  # parameters per log_batch call (MLflow's limit)


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts as ``a.b`` keys, values as text (MLflow's parameters are strings)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


class MLflowLogger(Tracker):
    """Logs a fit to MLflow (``pip install "easyfit-flax[mlflow]"``, the tracking client).

    At the start of training it records the configuration as the run's parameters (nested keys
    joined by dots: ``recipe.images.shape``) and whole as the artifact ``easyfit_config.json``:
    what the trainer knows (optimizer, batch size, epochs, steps per epoch and per dispatch,
    precision, seed, devices, input shape, the training data's input recipe) and ``config``. At
    each epoch's end it logs the epoch's logs as metrics ``epoch/<key>`` at step = the epoch
    (the metrics, ``val_*``, ``input_wait``, ``learning_rate`` when the optimizer exposes it);
    with an integer ``update_freq`` also ``batch/<key>`` (the epoch's running metrics and the
    learning rate) at step = the optimizer step, every that many batches, read from the device
    at those batches only. Only process 0 logs.

    A run started before ``fit`` (``mlflow.start_run()``), with no ``tracking_uri`` given, is
    logged to and left open (a parameter it already holds with another value keeps that value,
    with a warning: MLflow's parameters do not change); otherwise each ``fit`` starts a run in
    ``experiment_name`` and ends it FINISHED, KILLED (interrupted) or FAILED.

    Args:
        experiment_name: the experiment (created if missing; None: ``"Default"``).
        run_name: the run's name (None: MLflow picks one).
        tracking_uri: where to log (None: MLflow's, ``MLFLOW_TRACKING_URI``): a server
            (``http://...``), a database, or a local folder (``file:///.../mlruns``: recent MLflow
            wants ``MLFLOW_ALLOW_FILE_STORE=true`` for it).
        tags: the run's tags.
        config: more configuration to record; its keys replace the trainer's.
        update_freq: ``"epoch"``, or log batch metrics every that many batches (dispatches,
            as for every batch hook).
        log_checkpoints: the ``ModelCheckpoint`` of the same fit: each checkpoint it writes is
            logged under the artifacts ``checkpoints/<directory name>/`` (a directory written
            again replaces its files there), after the hook that wrote it.

    Raises:
        ImportError: mlflow is not installed (naming the extra that installs it).

    Example:
        >>> import tempfile
        >>> tmp = tempfile.mkdtemp()
        >>> from easyfit.callbacks import MLflowLogger
        >>> logger = MLflowLogger("mnist", tracking_uri="file://" + tmp + "/mlruns")
    """

    def __init__(
        self,
        experiment_name: str | None = None,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        update_freq: str | int = "epoch",
        log_checkpoints: ModelCheckpoint | None = None,
    ):
        self._mlflow = import_extra("mlflow", "mlflow", "MLflowLogger")
        super().__init__(config, update_freq, log_checkpoints)
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tracking_uri = tracking_uri
        self.tags = dict(tags or {})
        self.client: Any = None  # the MlflowClient logging
        self.run_id: str | None = None  # the run logged to
        self._owns = False

    def _open(self, config: dict[str, Any]) -> None:
        mlflow = self._mlflow
        active = mlflow.active_run() if self.tracking_uri is None else None
        self.client = mlflow.MlflowClient(tracking_uri=self.tracking_uri)
        if active is not None:
            self.run_id, self._owns = active.info.run_id, False
            for key, value in self.tags.items():
                self.client.set_tag(self.run_id, key, value)
        else:
            name = self.experiment_name or "Default"
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
            run = self.client.create_run(experiment_id, run_name=self.run_name, tags=self.tags)
            self.run_id, self._owns = run.info.run_id, True
        held = self.client.get_run(self.run_id).data.params
        params = _flat(config)
        kept = sorted(k for k, v in params.items() if k in held and held[k] != v)
        if kept:
            warnings.warn(
                f"MLflowLogger: run {self.run_id} already has the parameters {', '.join(kept)} with "
                "other values, which MLflow does not change: kept; this fit's configuration is "
                "in the artifact easyfit_config.json",
                UserWarning,
                stacklevel=3,
            )
        new = [mlflow.entities.Param(k, v) for k, v in params.items() if k not in held]
        for i in range(0, len(new), _BATCH):
            self.client.log_batch(self.run_id, params=new[i : i + _BATCH])
        self.client.log_dict(self.run_id, config, "easyfit_config.json")

    def _log(self, metrics: dict[str, float], step: int, epoch: int | None) -> None:
        now = int(time.time() * 1000)
        at = step if epoch is None else epoch
        entries = [self._mlflow.entities.Metric(k, v, now, at) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=entries)

    def _log_checkpoint(self, path: str) -> None:
        self.client.log_artifacts(self.run_id, path, artifact_path=f"checkpoints/{os.path.basename(path)}")

    def _close(self, status: str) -> None:
        if self._owns:
            self.client.set_terminated(self.run_id, status=_STATUS[status])
        self.client = self.run_id = None
