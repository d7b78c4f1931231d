"""A user-written callback: reads metrics, stops training, writes a file; and the example."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optax
import pytest

import easyfit as ef
from tests.helpers.models import SmallMLP

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_callback.py"


class StopBelowLoss(ef.callbacks.Callback):
    """Reads the running loss after every batch, stops below ``threshold``, writes a log."""

    def __init__(self, threshold: float, path: str):
        super().__init__()
        self.threshold, self.path, self.seen = threshold, path, []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append((self.model.progress.epoch, batch, logs["loss"]))
        if logs["loss"] < self.threshold:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        with open(self.path, "w") as f:
            json.dump({"seen": self.seen, "final": dict(logs)}, f)


def test_user_callback_reads_metrics_stops_and_writes(tmp_path, mnist_arrays):
    (x, y), (xv, yv) = mnist_arrays["train"], mnist_arrays["val"]
    trainer = ef.Trainer(
        SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0, steps_per_execution=1
    )  # batch hooks at every step
    stop = StopBelowLoss(1.0, str(tmp_path / "log.json"))
    history = trainer.fit(
        ef.data.Arrays(x[:2000], y[:2000], scale=1 / 255),
        epochs=5,
        batch_size=100,
        verbose=0,
        validation_data=(xv[:200], yv[:200]),
        callbacks=[stop],
    )
    epoch, batch, loss = stop.seen[-1]
    assert loss < 1.0 and all(seen[2] >= 1.0 for seen in stop.seen[:-1])
    assert history.epoch == list(range(epoch + 1))  # stopped mid-epoch; that epoch still ends
    assert int(trainer.state.step) == len(stop.seen) == epoch * 20 + batch + 1
    written = json.load(open(tmp_path / "log.json"))
    assert written["final"] == {k: v[-1] for k, v in history.history.items()}
    assert written["final"]["loss"] == loss  # the epoch's running loss at the stop


@pytest.mark.slow
def test_the_example_stops_at_its_target_and_writes_its_report(tmp_path):
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLE.parents[1]), os.environ.get("PYTHONPATH")])),
    }
    import easyfit as ef

    root = ef.datasets.sample_folder(str(tmp_path / "mnist"), limit=(2000, 500))
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--data",
            root,
            "--target",
            "0.85",
            "--out",
            str(tmp_path / "report.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.load(open(tmp_path / "report.json"))
    accuracies = [e["val_accuracy"] for e in report["epochs"]]
    assert report["reached"] and accuracies[-1] >= 0.85 and all(a < 0.85 for a in accuracies[:-1])
    assert report["steps"] == 20 * len(accuracies)
    assert "reached 0.85" in proc.stdout
