"""CSVLogger and TensorBoard write what History records, in files their readers understand."""

from __future__ import annotations

import csv
import glob

import optax
import pytest

import easyfit as ef
from easyfit.callbacks import CSVLogger, TensorBoard
from tests.helpers import untrained
from tests.helpers.models import SmallMLP


@pytest.fixture(scope="module")
def _module_trainer():
    return ef.Trainer(
        SmallMLP(),
        optimizer=optax.inject_hyperparams(optax.adam)(learning_rate=1e-3),
        seed=0,
        steps_per_execution=1,
    )  # batch hooks at every step


@pytest.fixture
def trainer(_module_trainer):
    """The module's trainer (compiled once), given to each test untrained."""
    return untrained(_module_trainer)


def _fit(trainer, mnist_arrays, callbacks, epochs=2):
    (x, y), (xv, yv) = mnist_arrays["train"], mnist_arrays["val"]
    return trainer.fit(
        ef.data.Arrays(x[:600], y[:600], scale=1 / 255),
        epochs=epochs,
        batch_size=100,
        verbose=0,
        validation_data=(xv[:200], yv[:200]),
        callbacks=callbacks,
    )


def test_csv_logger_rows_and_append(tmp_path, trainer, mnist_arrays):
    path = tmp_path / "logs" / "training.csv"
    first = _fit(trainer, mnist_arrays, [CSVLogger(path)])
    second = _fit(trainer, mnist_arrays, [CSVLogger(path, append=True)], epochs=1)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    keys = sorted(first.history)
    assert list(rows[0]) == ["epoch", *keys]
    assert "learning_rate" in keys  # the optimizer injects it
    expected = [
        (e, {k: v[i] for k, v in h.history.items()}) for h in (first, second) for i, e in enumerate(h.epoch)
    ]
    assert [int(r["epoch"]) for r in rows] == [e for e, _ in expected]
    for row, (_, logs) in zip(rows, expected, strict=True):
        assert {k: float(row[k]) for k in keys} == logs
    _fit(trainer, mnist_arrays, [CSVLogger(path, separator=";")], epochs=1)  # overwrites
    assert open(path).read().splitlines()[0] == ";".join(["epoch", *keys])


def test_tensorboard_event_files_read_by_tensorboard(tmp_path, trainer, mnist_arrays):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    history = _fit(trainer, mnist_arrays, [TensorBoard(tmp_path, update_freq=4)])

    def scalars(split):
        files = glob.glob(str(tmp_path / split / "events.out.tfevents.*"))
        assert len(files) == 1
        acc = accumulator.EventAccumulator(files[0])
        acc.Reload()
        return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}

    train, val = scalars("train"), scalars("validation")
    for key, values in history.history.items():
        split, name = (val, key[4:]) if key.startswith("val_") else (train, key)
        assert split[f"epoch_{name}"] == [(e, pytest.approx(v)) for e, v in enumerate(values)]
    assert [s for s, _ in train["batch_loss"]] == [4, 8, 12]  # 12 batches, every 4
    assert set(train) == {
        "epoch_loss",
        "epoch_accuracy",
        "epoch_learning_rate",
        "epoch_input_wait",
        "batch_loss",
        "batch_accuracy",
    }
