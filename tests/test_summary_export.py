"""trainer.summary(): the parameter table and totals (clu's parameter_overview). trainer.export():
the inference function as serialized StableHLO with the weights inside, run by plain JAX in
another process (no easyfit, no model class), for batch sizes it was not traced with."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

import easyfit as ef
from tests.helpers.models import NNXRegularised, RegularisedCNN


class NormedCNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(4, (3, 3), strides=(2, 2))(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train)(x))
        return nn.Dense(10)(x.reshape((x.shape[0], -1)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = ef.datasets.sample_folder(tmp_path_factory.mktemp("s") / "digits", limit=(300, 50))
    trainer = ef.Trainer(NormedCNN(), optimizer=optax.adam(1e-3), precision="bfloat16")
    trainer.fit(root, epochs=1, batch_size=50, verbose=0)
    return trainer, root


def test_summary_lists_parameters_and_totals(trained, capsys):
    trainer, _ = trained
    assert trainer.summary() is None  # printed, not returned (Keras): shown once in a notebook
    text = capsys.readouterr().out
    kept: list[str] = []
    trainer.summary(print_fn=kept.append)
    assert kept == [text.rstrip("\n")]
    totals = [line for line in text.splitlines() if line.startswith("Total")]
    assert totals == [text.rstrip().splitlines()[-1]]  # one Total line, the last
    assert "Conv_0/kernel" in text and "(3, 3, 1, 4)" in text
    assert "BatchNorm_0/mean" in text  # non-trainable statistics listed apart
    conv, bn, dense = 3 * 3 * 4 + 4, 2 * 4, 14 * 14 * 4 * 10 + 10
    assert f"Trainable parameters: {conv + bn + dense:,}" in text
    assert "Non-trainable variables: 8 " in text


PLAIN_JAX = """
import json, sys
import jax, numpy as np
fn = jax.export.deserialize(bytearray(open(sys.argv[1] + "/model.stablehlo", "rb").read())).call
meta = json.load(open(sys.argv[1] + "/model.json"))
x = np.load(sys.argv[2])
out = {str(n): np.asarray(fn(x[:n])).tolist() for n in (3, 7)}
print(json.dumps({"out": out, "classes": meta["class_names"]}))
"""


@pytest.mark.slow
def test_exported_model_runs_without_easyfit_and_matches_predict(trained, tmp_path):
    trainer, root = trained
    path = trainer.export(tmp_path / "exported")
    images = ef.datasets.sample()["val"][0][:7]  # uint8 (n, 28, 28, 1), as the folder delivers
    np.save(tmp_path / "x.npy", images)
    proc = subprocess.run(
        [sys.executable, "-I", "-c", PLAIN_JAX, path, str(tmp_path / "x.npy")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "easyfit" not in proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["classes"] == [str(d) for d in range(10)]
    expected = trainer.predict(ef.data.Arrays(images, np.zeros(7, np.int32), scale=1 / 255))
    for n in ("3", "7"):  # batch sizes never traced: the batch dimension is symbolic
        np.testing.assert_allclose(np.asarray(got["out"][n]), expected[: int(n)], rtol=0, atol=1e-5)
    fn, meta = ef.persistence.export.load_exported(path)
    assert meta["input_shape"] == [None, 28, 28, 1] and meta["input_dtype"] == "uint8"
    np.testing.assert_allclose(np.asarray(fn(images[:5])), expected[:5], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "make, precision",
    [(lambda: RegularisedCNN(), "float32"), (lambda: NNXRegularised(nnx.Rngs(0)), "bfloat16")],
    ids=["linen", "nnx"],
)
def test_every_public_method_on_models_with_dropout_batchnorm_and_rngs(make, precision, tmp_path):
    """fit, evaluate, predict, summary, export, save and from_checkpoint (load) on each model
    kind the docs show: NNX models keep typed PRNG keys in their state, which no dtype cast
    touches and the summary lists by their key data."""
    x, y = ef.datasets.sample()["train"]
    x, y = x[:16], y[:16]
    data = ef.data.Arrays(x, y, scale=1 / 255)
    trainer = ef.Trainer(make(), optimizer=optax.adam(1e-3), precision=precision, seed=0)
    trainer.fit(data, epochs=1, batch_size=8, verbose=0)
    assert set(trainer.evaluate(data, batch_size=8, verbose=0)) >= {"loss", "accuracy"}
    expected = trainer.predict(data, batch_size=8, verbose=0)
    assert expected.shape == (16, 10) and np.isfinite(expected).all()
    kept: list[str] = []
    trainer.summary(print_fn=kept.append)
    assert "Total:" in kept[0]
    if isinstance(trainer.model, nnx.Module):
        for key in ("dropout/rngs/key", "rngs/default/key"):  # Dropout's stream, the held Rngs'
            assert re.search(rf"{key}\s*\|\s*\(2,\)\s*\|\s*uint32", kept[0]), kept[0]
    fn, _ = ef.persistence.export.load_exported(trainer.export(tmp_path / "exported"))
    # one batch of predict's size: the NNX model draws noise of the batch's shape
    np.testing.assert_allclose(np.asarray(fn(x[:8])), expected[:8], rtol=0, atol=1e-5)
    path = trainer.save(tmp_path / "ckpt")
    again = ef.Trainer.from_checkpoint(path, make(), optimizer=optax.adam(1e-3), precision=precision)
    np.testing.assert_allclose(again.predict(data, batch_size=8, verbose=0), expected, rtol=0, atol=1e-6)
