"""CSVLogger, TensorBoard, WandbLogger and MLflowLogger write what History records where their
readers find it. The experiment trackers are tested for real and offline: W&B in offline mode
writing its run file (read back with W&B's own record classes), MLflow against a local file
store (read back with MlflowClient)."""

from __future__ import annotations

import csv
import glob
import os
import textwrap

import optax
import pytest

import easyfit as ef
from easyfit.callbacks import (
    CallbackList,
    CSVLogger,
    LambdaCallback,
    MLflowLogger,
    ModelCheckpoint,
    TensorBoard,
    WandbLogger,
)
from tests.helpers import run_python, untrained
from tests.helpers.models import SmallMLP

STEPS = 6  # batches (= steps) per epoch in _fit: 600 samples of 100


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


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B offline, silent, every folder of its own in tmp_path: never logs in, never uploads."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        folder = tmp_path / name.lower()
        folder.mkdir()
        monkeypatch.setenv(name, str(folder))
    pytest.importorskip("wandb")
    return tmp_path / "wandb_dir"  # WandbLogger(dir=...) the run's


@pytest.fixture
def file_store(tmp_path, monkeypatch):
    """A local MLflow file store in tmp_path (recent MLflow asks for the opt-in to use one)."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


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


def _trace_events(log_dir):
    """The XLA op events of the one trace under ``log_dir/train/plugins/profile``, read back
    both from the ``.xplane.pb`` (by JAX's own reader) and from Perfetto's JSON: ``[(module,
    execution, op)]`` from each."""
    import gzip
    import json

    import jax

    runs = glob.glob(str(log_dir / "train" / "plugins" / "profile" / "*"))
    assert len(runs) == 1
    (xplane,) = glob.glob(runs[0] + "/*.xplane.pb")
    assert glob.glob(runs[0] + "/*.trace.json.gz")
    from_xplane = []
    for plane in jax.profiler.ProfileData.from_file(xplane).planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" in stats:
                    from_xplane.append((stats["hlo_module"], int(stats["run_id"]), event.name))
    with gzip.open(runs[0] + "/perfetto_trace.json.gz") as f:
        events = json.load(f)["traceEvents"]
    from_perfetto = [
        (e["args"]["hlo_module"], int(e["args"]["run_id"]), e["name"])
        for e in events
        if "hlo_op" in e.get("args", {})
    ]
    return from_xplane, from_perfetto


def test_tensorboard_profile_batch_traces_whole_dispatches_of_those_batches(tmp_path, mnist_arrays):
    # batches are dispatches: with steps_per_execution=2, batches 2-3 are steps 3-6
    trainer = ef.Trainer(SmallMLP(), optimizer="adam", seed=0, steps_per_execution=2)
    (x, y) = mnist_arrays["train"]
    trainer.fit(
        ef.data.Arrays(x[:600], y[:600], scale=1 / 255),
        epochs=1,
        batch_size=100,
        verbose=0,
        callbacks=[TensorBoard(tmp_path, profile_batch=(2, 3))],
    )
    from_xplane, from_perfetto = _trace_events(tmp_path)
    for events in (from_xplane, from_perfetto):
        (step_module,) = {module for module, _, op in events if op.startswith("dot")}  # the train step's
        assert step_module.startswith("jit_")
        train = [(run, op) for module, run, op in events if module == step_module]
        runs = {run for run, _ in train}
        assert len(runs) == 2  # two dispatches, whole: nothing of the one before
        ops = {op.split(".")[0] for _, op in train}
        assert "dot" in ops and any("fusion" in op for op in ops)  # the Dense layers' matmuls
        per_run = {(run, op): sum(1 for r, o in train if (r, o) == (run, op)) for run, op in train}
        dots = {n for (_, op), n in per_run.items() if op.startswith("dot")}
        assert dots == {2}  # each dispatch ran its step's matmuls twice: k = 2 steps
    assert sorted(from_xplane) == sorted(from_perfetto)


@pytest.mark.parametrize(
    "given, expected",
    [
        (0, None),
        ("0", None),
        ((0, 0), None),
        (3, (3, 3)),
        ((2, 5), (2, 5)),
        ([2, 5], (2, 5)),
        ("2,5", (2, 5)),
        ("4", (4, 4)),
    ],
)
def test_tensorboard_profile_batch_takes_keras_forms(tmp_path, given, expected):
    board = TensorBoard(tmp_path, profile_batch=given)
    assert board.profile_batch == expected
    # no batch hook at all without a trace or batch scalars: fit reads nothing from the device
    hooks = CallbackList([board], None, {})
    assert hooks.wants("on_train_batch_begin") == hooks.wants("on_train_batch_end") == (expected is not None)


@pytest.mark.parametrize("given", [-1, (3, 2), (0, 2), (1, 2, 3), "a,b", "1,2,3", 1.5, True, None, (1, -1)])
def test_tensorboard_bad_profile_batch_is_a_value_error_naming_it(tmp_path, given):
    with pytest.raises(ValueError, match=r"profile_batch=.*batches count from 1"):
        TensorBoard(tmp_path, profile_batch=given)


def test_tensorboard_profile_batch_past_the_fit_warns(tmp_path, trainer, mnist_arrays):
    with pytest.warns(UserWarning, match=r"profile_batch=\(7, 7\)\): no trace written: this fit trained 6"):
        _fit(trainer, mnist_arrays, [TensorBoard(tmp_path, profile_batch=7)], epochs=1)
    assert not (tmp_path / "train" / "plugins").exists()


def test_tensorboard_profile_left_to_a_trace_already_running(tmp_path, trainer, mnist_arrays):
    import jax

    jax.profiler.start_trace(str(tmp_path / "mine"))
    try:
        with pytest.warns(UserWarning, match="no trace written"):
            _fit(trainer, mnist_arrays, [TensorBoard(tmp_path / "board", profile_batch=1)], epochs=1)
    finally:
        jax.profiler.stop_trace()  # still the user's to stop
    assert glob.glob(str(tmp_path / "mine" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert not (tmp_path / "board" / "train" / "plugins").exists()


def _files(folder):
    return sorted(
        os.path.relpath(os.path.join(d, f), folder) for d, _, names in os.walk(folder) for f in names
    )


def _expected_config(trainer):
    meta = trainer.checkpoint_meta
    return {
        "optimizer": meta["optimizer"]["state"],  # given as an optax object: its state's layout
        "batch_size": 100,
        "epochs": 2,
        "precision": "float32",
        "seed": 0,
        "steps_per_epoch": STEPS,
        "steps_per_execution": 1,
        "train_samples": 600,
        "devices": 1,
    }


def test_wandb_logger_writes_config_metrics_and_checkpoints_offline(
    tmp_path, offline_wandb, trainer, mnist_arrays
):
    import wandb

    from tests.helpers.wandb_records import offline_run

    checkpoints = ModelCheckpoint(tmp_path / "ckpt" / "{epoch:02d}")
    logger = WandbLogger(
        project="easyfit-test",
        config={"note": "offline"},
        update_freq=2,
        log_checkpoints=checkpoints,
        dir=str(offline_wandb),
    )
    history = _fit(trainer, mnist_arrays, [checkpoints, logger])
    wandb.teardown()  # W&B's service writes the run's last records as it ends
    run = offline_run(offline_wandb)

    config = run["config"]
    assert {k: config[k] for k in _expected_config(trainer)} == _expected_config(trainer)
    assert config["note"] == "offline"
    assert config["recipe"] == trainer.checkpoint_meta["recipe"]
    assert config["input_shape"] == [28, 28, 1]

    epochs = [row for row in run["history"] if "epoch/epoch" in row]
    assert [row["epoch/epoch"] for row in epochs] == [0, 1]
    for key, values in history.history.items():  # loss, accuracy, val_*, input_wait, learning_rate
        assert [row[f"epoch/{key}"] for row in epochs] == pytest.approx(values, rel=1e-6)
    assert "learning_rate" in history.history and "input_wait" in history.history

    batches = [row for row in run["history"] if "batch/step" in row]
    assert [row["batch/step"] for row in batches] == [2, 4, 6, 8, 10, 12]  # every 2 batches
    assert all(row["batch/learning_rate"] == pytest.approx(1e-3) for row in batches)
    # an epoch's last batch logs the epoch's running metrics: its epoch metrics
    ends = [row["batch/loss"] for row in batches if row["batch/step"] % STEPS == 0]
    assert ends == pytest.approx(history.history["loss"], rel=1e-6)

    assert [(name, kind) for name, kind, _ in run["artifacts"]] == [
        (f"run_{run['run_id']}_01", "model"),
        (f"run_{run['run_id']}_02", "model"),
    ]
    for (_, _, files), path in zip(run["artifacts"], checkpoints.saved, strict=True):
        assert sorted(files) == _files(path)  # the whole checkpoint directory
    assert run["exit_code"] == 0


def test_mlflow_logger_writes_params_metrics_and_checkpoints_to_a_file_store(
    tmp_path, file_store, trainer, mnist_arrays
):
    import mlflow

    checkpoints = ModelCheckpoint(tmp_path / "ckpt" / "{epoch:02d}")
    logger = MLflowLogger(
        "easyfit-test",
        run_name="first",
        tracking_uri=file_store,
        tags={"team": "vision"},
        config={"note": "local"},
        update_freq=3,
        log_checkpoints=checkpoints,
    )
    history = _fit(trainer, mnist_arrays, [checkpoints, logger])
    client = mlflow.MlflowClient(file_store)
    (run,) = client.search_runs([client.get_experiment_by_name("easyfit-test").experiment_id])
    assert (run.info.run_name, run.info.status, run.data.tags["team"]) == ("first", "FINISHED", "vision")

    params = run.data.params
    assert {k: params[k] for k in _expected_config(trainer)} == {
        k: str(v) for k, v in _expected_config(trainer).items()
    }
    assert params["note"] == "local"
    assert params["recipe.source"] == "Arrays" and params["input_shape"] == "[28, 28, 1]"
    whole = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/easyfit_config.json")
    assert whole["recipe"] == trainer.checkpoint_meta["recipe"]

    def history_of(key):
        return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]

    for key, values in history.history.items():  # loss, accuracy, val_*, input_wait, learning_rate
        assert history_of(f"epoch/{key}") == [(e, pytest.approx(v, rel=1e-6)) for e, v in enumerate(values)]
    assert "learning_rate" in history.history and "input_wait" in history.history
    batch_loss = history_of("batch/loss")
    assert [step for step, _ in batch_loss] == [3, 6, 9, 12]  # the optimizer step, every 3 batches
    ends = [value for step, value in batch_loss if step % STEPS == 0]  # an epoch's last batch
    assert ends == pytest.approx(history.history["loss"], rel=1e-6)
    assert [v for _, v in history_of("batch/learning_rate")] == pytest.approx([1e-3] * 4)

    logged = [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")]
    assert logged == ["checkpoints/01", "checkpoints/02"]
    for path in checkpoints.saved:
        local = mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id,
            artifact_path=f"checkpoints/{os.path.basename(path)}",
            dst_path=str(tmp_path / "back"),
            tracking_uri=file_store,
        )
        assert _files(local) == _files(path)


def test_mlflow_logger_logs_into_an_active_run_and_marks_failed_and_interrupted_fits(
    file_store, trainer, mnist_arrays
):
    import mlflow

    def fail(epoch, logs):
        raise RuntimeError("boom")

    with mlflow.start_run() as active:
        _fit(trainer, mnist_arrays, [MLflowLogger(config={"note": "mine"})], epochs=1)
        assert mlflow.active_run().info.run_id == active.info.run_id  # left open
    run = mlflow.MlflowClient().get_run(active.info.run_id)
    assert run.info.status == "FINISHED" and run.data.params["note"] == "mine"
    assert [m.step for m in mlflow.MlflowClient().get_metric_history(run.info.run_id, "epoch/loss")] == [0]

    with pytest.raises(RuntimeError, match="boom"):
        _fit(trainer, mnist_arrays, [MLflowLogger("failing"), LambdaCallback(on_epoch_end=fail)], epochs=1)
    client = mlflow.MlflowClient()
    (failed,) = client.search_runs([client.get_experiment_by_name("failing").experiment_id])
    assert failed.info.status == "FAILED"

    def interrupt(epoch, logs):
        raise KeyboardInterrupt  # as Ctrl-C: fit calls on_interrupt, then on_train_end

    with pytest.raises(KeyboardInterrupt):
        _fit(
            trainer, mnist_arrays, [MLflowLogger("stopped"), LambdaCallback(on_epoch_end=interrupt)], epochs=1
        )
    (stopped,) = client.search_runs([client.get_experiment_by_name("stopped").experiment_id])
    assert stopped.info.status == "KILLED"


def test_a_missing_tracker_package_names_the_extra():
    code = textwrap.dedent("""
        import sys
        sys.modules["wandb"] = sys.modules["mlflow"] = None  # as if not installed
        from easyfit.callbacks import MLflowLogger, WandbLogger
        for logger in (WandbLogger, MLflowLogger):
            try:
                logger()
            except ImportError as e:
                print(e)
        """)
    assert run_python("-c", code).splitlines() == [
        'WandbLogger needs wandb: pip install "easyfit-flax[wandb]"',
        'MLflowLogger needs mlflow: pip install "easyfit-flax[mlflow]"',
    ]


@pytest.mark.parametrize("cls", [WandbLogger, MLflowLogger])
def test_trackers_read_batch_logs_only_with_an_integer_update_freq(cls):
    assert not CallbackList([cls()], None, {}).wants("on_train_batch_end")  # no host sync per step
    assert CallbackList([cls(update_freq=10)], None, {}).wants("on_train_batch_end")
    with pytest.raises(ValueError, match="update_freq=0"):
        cls(update_freq=0)
    with pytest.raises(TypeError, match="log_checkpoints=.*expected None or the ModelCheckpoint"):
        cls(log_checkpoints="ckpt")
