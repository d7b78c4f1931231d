"""A Keras user's first hour (issue 14): what they try first works as in Keras, or says why not.

Data: the MNIST sample inside easyfit (``ef.datasets.sample()``), or arrays the tests make.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import easyfit as ef
from tests.helpers import ROOT
from tests.helpers.models import NNXMLP, SmallMLP

N = 400  # training samples: enough for a few steps, small enough to stay fast


@pytest.fixture(scope="module")
def sample():
    data = ef.datasets.sample()
    (x, y), (xv, yv) = data["train"], data["val"]
    return x[:N].astype(np.float32) / 255, y[:N], xv[:100].astype(np.float32) / 255, yv[:100]


# ------------------------------------------------------------------------------- optimizers
@pytest.mark.parametrize(
    "name, make, kwargs",
    [
        ("adam", optax.adam, {"learning_rate": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-7}),
        ("sgd", optax.sgd, {"learning_rate": 1e-2}),
        ("rmsprop", optax.rmsprop, {"learning_rate": 1e-3, "decay": 0.9, "eps": 1e-7}),
        (
            "adamw",
            optax.adamw,
            {"learning_rate": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-7, "weight_decay": 0.004},
        ),
        ("adagrad", optax.adagrad, {"learning_rate": 1e-3, "initial_accumulator_value": 0.1, "eps": 1e-7}),
    ],
)
def test_optimizer_names_are_keras_defaults(name, make, kwargs):
    """Keras 3's defaults (keras/src/optimizers/*.py): the same updates as the optax
    optimizer built with them, step after step (to 2e-5: injected hyperparameters are float32
    arrays, so Adam's bias correction 1 - 0.999**t rounds differently)."""
    tx = ef.Trainer(SmallMLP(), optimizer=name.upper() if name == "adam" else name).optimizer
    expected = make(**kwargs)
    params = {"w": jax.numpy.linspace(-1.0, 1.0, 6)}
    state, ref_state = tx.init(params), expected.init(params)
    assert ef.core.learning_rate.get_learning_rate(state) == pytest.approx(kwargs["learning_rate"])
    for step in range(3):
        grads = {"w": jax.numpy.cos(params["w"] * (step + 1))}
        updates, state = tx.update(grads, state, params)
        ref_updates, ref_state = expected.update(grads, ref_state, params)
        np.testing.assert_allclose(updates["w"], ref_updates["w"], rtol=2e-5, atol=1e-9)
        params = optax.apply_updates(params, updates)


def test_an_unknown_optimizer_name_lists_the_known_ones_at_construction():
    with pytest.raises(
        ValueError,
        match=r"optimizer='adamax'.*'adam', 'sgd', 'rmsprop', "
        r"'adamw', 'adagrad'",
    ):
        ef.Trainer(SmallMLP(), optimizer="adamax")
    with pytest.raises(ValueError, match="optimizer=3"):
        ef.Trainer(SmallMLP(), optimizer=3)


def test_fit_with_optimizer_adam_trains_and_logs_the_learning_rate(sample):
    x, y, xv, yv = sample
    trainer = ef.Trainer(SmallMLP(), optimizer="adam", seed=0)
    history = trainer.fit(x, y, epochs=2, batch_size=50, verbose=0)
    assert history.history["learning_rate"] == pytest.approx([1e-3, 1e-3])
    assert history.history["loss"][1] < history.history["loss"][0]


# ------------------------------------------------- labels: (n, 1) integers, one-hot floats
def test_labels_of_shape_n_1_and_one_hot_floats_train_as_class_indices(sample, capsys):
    """The same data three ways, the same seed: integer (n,), integer (n, 1) as Keras accepts,
    and one-hot float labels with no loss given (categorical cross-entropy, which equals the
    sparse one on one-hot rows). Losses and accuracies agree to float tolerance."""
    x, y, xv, yv = sample
    runs = {}
    for kind, (labels, val_labels) in {
        "sparse": (y, yv),
        "column": (y[:, None], yv[:, None]),
        "one_hot": (np.eye(10, dtype=np.float32)[y], np.eye(10, dtype=np.float32)[yv]),
    }.items():
        trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1), seed=0)
        history = trainer.fit(x, labels, epochs=2, batch_size=50, verbose=1, validation_data=(xv, val_labels))
        out = capsys.readouterr().out
        evaluated = trainer.evaluate(xv, val_labels, batch_size=50)
        predicted = trainer.predict(xv, batch_size=50)
        runs[kind] = (trainer.loss, out, history.history, evaluated, predicted)
    assert runs["sparse"][0] == runs["column"][0] == "sparse_categorical_crossentropy"
    assert runs["one_hot"][0] == "categorical_crossentropy"
    loss_lines = [line for line in runs["one_hot"][1].splitlines() if "loss='" in line]
    assert loss_lines == [
        "easyfit: loss='categorical_crossentropy' (none given; float labels "
        "whose rows are one-hot or class probabilities)"
    ]
    assert "loss='sparse_categorical_crossentropy' (none given; integer labels" in runs["column"][1]
    _, _, reference, ref_eval, ref_predicted = runs["sparse"]
    assert reference["val_accuracy"][-1] > 0.5
    for kind in ("column", "one_hot"):
        _, _, history, evaluated, predicted = runs[kind]
        assert (
            sorted(history)
            == sorted(reference)
            == ["accuracy", "input_wait", "loss", "val_accuracy", "val_loss"]
        )
        for key in ("accuracy", "loss", "val_accuracy", "val_loss"):  # input_wait is a timing
            np.testing.assert_allclose(history[key], reference[key], rtol=1e-4, atol=1e-5)
        assert evaluated == pytest.approx(ref_eval, rel=1e-4, abs=1e-5)
        np.testing.assert_allclose(predicted, ref_predicted, rtol=1e-4, atol=1e-4)


def test_float_labels_that_are_not_one_hot_stay_mean_squared_error():
    from easyfit.core.losses import infer_loss

    rows = np.array([[0.2, 0.5], [0.3, 0.1]], np.float32)  # no distribution: regression
    assert infer_loss(rows.dtype, rows)[0] == "mse"
    assert infer_loss(np.dtype(np.float32), np.array([0.5, 1.0]))[0] == "mse"
    soft = np.array([[0.9, 0.1], [0.25, 0.75]], np.float32)
    assert infer_loss(soft.dtype, soft)[0] == "categorical_crossentropy"


# ---------------------------------------------------------------------- bad numbers
@pytest.mark.parametrize(
    "call, kwargs, argument",
    [
        ("fit", {"batch_size": 0}, "batch_size=0"),
        ("fit", {"batch_size": -8}, "batch_size=-8"),
        ("fit", {"batch_size": 2.5}, "batch_size=2.5"),
        ("fit", {"epochs": -1}, "epochs=-1"),
        ("fit", {"epochs": 1.5}, "epochs=1.5"),
        ("fit", {"epochs": "3"}, "epochs='3'"),
        ("fit", {"initial_epoch": -2}, "initial_epoch=-2"),
        ("fit", {"verbose": 3}, "verbose=3"),
        ("evaluate", {"batch_size": 0}, "batch_size=0"),
        ("evaluate", {"batch_size": -8}, "batch_size=-8"),
        ("predict", {"batch_size": -8}, "batch_size=-8"),
        ("predict", {"batch_size": True}, "batch_size=True"),
    ],
)
def test_bad_numbers_raise_a_value_error_naming_the_argument(sample, call, kwargs, argument):
    x, y, _, _ = sample
    trainer = ef.Trainer(SmallMLP())
    args = (x,) if call == "predict" else (x, y)
    with pytest.raises(ValueError, match=re.escape(argument) + ": expected"):
        getattr(trainer, call)(*args, **kwargs)
    assert trainer.state is None  # refused at entry, before any data was read


@pytest.mark.parametrize("value", [0, -1, 2.0, True])
def test_bad_steps_per_execution_is_refused_at_construction(value):
    with pytest.raises(ValueError, match=re.escape(f"steps_per_execution={value!r}")):
        ef.Trainer(SmallMLP(), steps_per_execution=value)


# ------------------------------------------------------------------------------ NNX after fit
def test_the_users_nnx_module_holds_the_trained_state_after_fit(sample):
    x, y, xv, _ = sample
    model = NNXMLP(nnx.Rngs(0))
    before = np.asarray(model.out.kernel[...]).copy()
    trainer = ef.Trainer(model, optimizer=optax.sgd(0.1), seed=0)
    for _ in range(2):  # a second fit donates the state again: the module stays usable
        trainer.fit(x, y, epochs=1, batch_size=50, verbose=0)
        direct = np.asarray(model(xv))  # the user's own module, called as after Keras' fit
        np.testing.assert_allclose(direct, trainer.predict(xv, batch_size=50), rtol=1e-5, atol=1e-5)
    trained = np.asarray(model.out.kernel[...])
    assert np.abs(trained - before).max() > 1e-3  # trained, not the initial weights
    np.testing.assert_array_equal(trained, np.asarray(trainer.params["out"]["kernel"][...]))


def test_write_back_leaves_the_module_as_it_was_when_the_state_was_donated():
    """A step that failed after donating the state: fit's clean-up must not raise over it."""
    import types

    from easyfit.core.models import write_back

    model = NNXMLP(nnx.Rngs(0))
    before = np.asarray(model.out.kernel[...]).copy()
    _, params, rest = nnx.split(model, nnx.Param, ...)
    params = jax.tree_util.tree_map(lambda a: a + 1, params)
    jax.tree_util.tree_leaves(params)[0].delete()
    write_back(model, types.SimpleNamespace(params=params, model_state=rest))
    np.testing.assert_array_equal(np.asarray(model.out.kernel[...]), before)


# ------------------------------------------------------------------------- evaluate's result
def test_evaluate_return_dict_as_keras(sample):
    x, y, xv, yv = sample
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1), seed=0)
    trainer.fit(x, y, epochs=1, batch_size=50, verbose=0)
    as_dict = trainer.evaluate(xv, yv, batch_size=50, return_dict=True)
    assert list(as_dict) == ["loss", "accuracy"]
    assert trainer.evaluate(xv, yv, batch_size=50) == as_dict  # the default: a dict by name
    as_list = trainer.evaluate(xv, yv, batch_size=50, return_dict=False)
    assert as_list == pytest.approx([as_dict["loss"], as_dict["accuracy"]], rel=1e-6)
    only_loss = ef.Trainer(SmallMLP(), metrics=[], seed=0)
    loss = only_loss.evaluate(xv, yv, batch_size=50, return_dict=False)
    assert isinstance(loss, float) and loss > 0


# ------------------------------------------------------------------------------ easyfit info
def test_info_finds_installed_requirements():
    from easyfit._info import collect, problems

    env = collect()
    assert env.versions.get("packaging") and env.versions.get("protobuf")
    assert not [p for p in problems(env) if "is not installed" in p and "DALI" not in p]


# ----------------------------------------------------------------------------------- predict
def test_predict_outputs_logits(sample):
    """As Keras' predict: the model's own outputs (here logits), with no softmax applied."""
    x, y, xv, _ = sample
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1), seed=0)
    trainer.fit(x, y, epochs=1, batch_size=50, verbose=0)
    predicted = trainer.predict(xv, batch_size=50)
    logits = np.asarray(SmallMLP().apply({"params": jax.device_get(trainer.params)}, xv))
    np.testing.assert_allclose(predicted, logits, rtol=1e-5, atol=1e-5)
    assert (predicted < 0).any() and not np.allclose(predicted.sum(-1), 1.0, atol=1e-2)


# ---------------------------------------------------------------------------------- examples
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def _example(path, *args, cwd=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, str(path), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_help_shows_defaults(path):
    proc = _example(path, "--help")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"--epochs EPOCHS\s+.*\(default: \d+\)", proc.stdout), proc.stdout


@pytest.mark.slow
def test_arrays_example_takes_a_folder_easyfit_reads(tmp_path):
    root = ef.datasets.sample_folder(tmp_path / "sample", limit=(300, 100))
    proc = _example(ROOT / "examples" / "arrays.py", "--data", root, "--epochs", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    labels = json.loads(re.search(r"labels:\s+(\[.*\])", proc.stdout).group(1))
    assert len(labels) == 10 and labels == sorted(labels)  # val/0/* first, in file order
    assert "evaluate: {'loss'" in proc.stdout


# ---------------------------------------------------------------------------- progress bar
def test_progress_display_per_environment():
    from easyfit.callbacks.progbar import display_mode

    assert display_mode(1, isatty=True, notebook=False) == "bar"  # a terminal: today's bar
    assert display_mode(1, isatty=False, notebook=True) == "bar"  # Jupyter: a widget, or a text bar
    assert display_mode(1, isatty=False, notebook=False) == "lines"  # a log file
    assert display_mode(2, isatty=True, notebook=True) == "lines"
    assert display_mode(0, isatty=True, notebook=True) is None


def test_a_jupyter_kernel_is_recognised_from_its_shell(monkeypatch):
    import types

    from easyfit.callbacks.progbar import in_notebook

    assert not in_notebook()  # pytest: no IPython shell
    for name, expected in (("ZMQInteractiveShell", True), ("TerminalInteractiveShell", False)):
        shell_type = type(name, (), {})
        colab_like = type("Shell", (shell_type,), {})  # Colab's shell subclasses Jupyter's
        ipython = types.SimpleNamespace(get_ipython=colab_like)
        monkeypatch.setitem(sys.modules, "IPython", ipython)
        assert in_notebook() is expected
