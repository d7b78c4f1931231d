"""CSVLogger and TensorBoard write what History records, in files their readers understand."""

from __future__ import annotations

import csv
import glob

import optax
import pytest

import easyfit as ef
from easyfit.callbacks import CallbackList, CSVLogger, TensorBoard
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
        train = [(run, op) for module, run, op in events if module == "jit_run"]  # steps.compile_train
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
