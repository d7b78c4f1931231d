"""Each program in examples/ runs briefly, on the packaged sample or on a folder (--data).

The programs run one after the other in one fresh interpreter with two CPU devices, each as
``python examples/NAME.py ARGS`` runs it (``runpy`` as ``__main__``, with its ``sys.argv``, in
a folder of its own): starting an interpreter and importing JAX and DALI is a large part of a
short program's time. They are compiled quickly (``tests.helpers.QUICK_COMPILE``), as the docs'
code blocks are. Each test checks what one program printed and wrote."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import QUICK_COMPILE, ROOT

pytestmark = pytest.mark.slow  # every test here runs programs in fresh interpreters

EXAMPLES = ROOT / "examples"

# ``python -c _RUNNER RUNS RESULTS PROGRAMS``: runs each program ``[name, argv, folder]`` of the
# JSON file RUNS as ``python PROGRAMS/name argv`` would, in ``folder``, and writes
# ``{name: {"out": what it printed, "error": its traceback}}`` to the file RESULTS; goes on with
# the next program after a failure.
_RUNNER = """
import contextlib, io, json, os, runpy, sys, traceback
runs, results_file, programs = sys.argv[1:]
results = {}
for name, argv, folder in json.load(open(runs)):
    os.makedirs(folder)
    os.chdir(folder)
    path = os.path.join(programs, name)
    sys.argv[:] = [path, *argv]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        results[name] = {"out": out.getvalue()}
    except BaseException:
        results[name] = {"out": out.getvalue(), "error": traceback.format_exc()}
    sys.stderr.write(out.getvalue())
with open(results_file, "w") as f:
    json.dump(results, f)
"""


@pytest.fixture(scope="module")
def ran(tmp_path_factory, mnist_dir) -> dict[str, dict[str, str]]:
    """``{program: {"out": ..., "folder": ...}}`` (and ``"error"``, a traceback, where one failed)
    of the runs the tests check."""
    base = tmp_path_factory.mktemp("examples")
    runs = [
        ["mnist_mlp.py", ["--data", mnist_dir, "--epochs", "1"]],
        ["mnist_cnn.py", ["--epochs", "1"]],
        ["finetune.py", ["--smoke"]],
        ["imagenet_resnet.py", ["--smoke"]],  # the same narrow ResNet-18: compiled once
        ["arrays.py", ["--epochs", "1"]],
        ["custom_callback.py", ["--epochs", "4", "--target", "0.5", "--out", "report.json"]],
    ]
    runs = [[name, argv, str(base / name.removesuffix(".py"))] for name, argv in runs]
    (base / "runs.json").write_text(json.dumps(runs))
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count=2 {QUICK_COMPILE}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    argv = [sys.executable, "-c", _RUNNER, str(base / "runs.json"), str(base / "results.json"), str(EXAMPLES)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = json.loads((base / "results.json").read_text())
    return {name: {**found[name], "folder": folder} for name, _, folder in runs}


def output(ran: dict, name: str) -> str:
    """What program ``name`` printed, after asserting that it ran to its end."""
    assert "error" not in ran[name], f"{name}:\n{ran[name]['out'][-3000:]}\n{ran[name]['error']}"
    return ran[name]["out"]


def accuracies(out: str) -> list[float]:
    found = re.findall(r"validation accuracy (?:after \d+ epochs: )?([\d.]+)", out)
    return [float(a) for a in found]


def test_mnist_mlp_on_one_device_then_every_device(ran):
    out = output(ran, "mnist_mlp.py")
    assert "1 device(s)" in out and "2 device(s)" in out
    one, every = accuracies(out)
    assert min(one, every) > 0.7
    assert abs(one - every) < 0.03  # same samples, same steps: only the summation order differs


def test_mnist_cnn_on_the_sample(ran):
    out = output(ran, "mnist_cnn.py")
    assert accuracies(out)[-1] > 0.7
    assert "2 device(s), replicas identical: True" in out


def test_finetune_from_weights_it_draws(ran):
    """Offline: a narrow ResNet-18's weights saved as timm's, loaded with a new head for the
    sample's 10 classes, the head alone trained one epoch."""
    out = output(ran, "finetune.py")
    assert "resnet18: head replaced for 10 classes: (64, 10)" in out
    assert len(accuracies(out)) == 1


def test_the_imagenet_example_runs_its_smoke_run(ran):
    assert "validation accuracy after 1 epochs:" in output(ran, "imagenet_resnet.py")


def test_arrays_on_the_sample(ran):
    out = output(ran, "arrays.py")
    evaluated = float(re.search(r"'accuracy': ([\d.]+)", out).group(1))
    assert evaluated > 0.7
    predicted, labels = (re.search(rf"{w}:\s+(\[.*\])", out).group(1) for w in ("predicted", "labels"))
    assert len(predicted.split(",")) == len(labels.split(",")) == 10


def test_custom_callback_stops_training_and_writes_its_file(ran):
    out = output(ran, "custom_callback.py")
    assert "reached 0.5 at epoch 1: stopping" in out
    with open(f"{ran['custom_callback.py']['folder']}/report.json") as f:
        report = json.load(f)
    assert report["reached"] and [e["epoch"] for e in report["epochs"]] == [1]
    assert report["epochs"][0]["val_accuracy"] >= 0.5
    assert report["steps"] == 6000 // 100  # one epoch of the packaged sample


def test_a_failing_program_is_named_and_the_next_one_runs(tmp_path):
    """The runner goes on after a program that fails (or exits), and says which."""
    (tmp_path / "bad.py").write_text("import sys\nprint('bad ran', sys.argv[1:])\nsys.exit(2)\n")
    (tmp_path / "good.py").write_text("import os\nprint('good ran in', os.path.basename(os.getcwd()))\n")
    runs = [["bad.py", ["--x"], str(tmp_path / "one")], ["good.py", [], str(tmp_path / "two")]]
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(tmp_path / "runs.json"), str(tmp_path / "r.json"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["bad.py"]["out"] == "bad ran ['--x']\n" and "SystemExit: 2" in results["bad.py"]["error"]
    assert results["good.py"] == {"out": "good ran in two\n"}
