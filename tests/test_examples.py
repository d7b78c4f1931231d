"""Each program in examples/ runs briefly, on the packaged sample or on a folder (--data)."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import ROOT, run_python

pytestmark = pytest.mark.slow  # every test here runs programs in fresh interpreters

EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, cwd, devices: int = 1) -> str:
    return run_python(str(EXAMPLES / name), *args, cwd=cwd, devices=devices)


def accuracies(out: str) -> list[float]:
    found = re.findall(r"validation accuracy (?:after \d+ epochs: )?([\d.]+)", out)
    return [float(a) for a in found]


def test_mnist_mlp_on_one_device_then_every_device(tmp_path, mnist_dir):
    out = run_example("mnist_mlp.py", "--data", mnist_dir, "--epochs", "1", cwd=tmp_path, devices=2)
    assert "1 device(s)" in out and "2 device(s)" in out
    one, every = accuracies(out)
    assert min(one, every) > 0.7
    assert abs(one - every) < 0.03  # same samples, same steps: only the summation order differs


def test_mnist_cnn_on_the_sample(tmp_path):
    out = run_example("mnist_cnn.py", "--epochs", "1", cwd=tmp_path)
    assert accuracies(out)[-1] > 0.7
    assert "replicas identical: True" in out


def test_finetune_from_weights_it_draws(tmp_path):
    """Offline: a narrow ResNet-18's weights saved as timm's, loaded with a new head for the
    sample's 10 classes, the head alone trained one epoch."""
    out = run_example("finetune.py", "--smoke", cwd=tmp_path)
    assert "resnet18: head replaced for 10 classes: (64, 10)" in out
    assert len(accuracies(out)) == 1


def test_arrays_on_the_sample(tmp_path):
    out = run_example("arrays.py", "--epochs", "1", cwd=tmp_path)
    evaluated = float(re.search(r"'accuracy': ([\d.]+)", out).group(1))
    assert evaluated > 0.7
    predicted, labels = (re.search(rf"{w}:\s+(\[.*\])", out).group(1) for w in ("predicted", "labels"))
    assert len(predicted.split(",")) == len(labels.split(",")) == 10


def test_custom_callback_stops_training_and_writes_its_file(tmp_path):
    out = run_example(
        "custom_callback.py", "--epochs", "4", "--target", "0.5", "--out", "report.json", cwd=tmp_path
    )
    assert "reached 0.5 at epoch 1: stopping" in out
    with open(tmp_path / "report.json") as f:
        report = json.load(f)
    assert report["reached"] and [e["epoch"] for e in report["epochs"]] == [1]
    assert report["epochs"][0]["val_accuracy"] >= 0.5
    assert report["steps"] == 6000 // 100  # one epoch of the packaged sample
