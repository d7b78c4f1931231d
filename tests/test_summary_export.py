"""trainer.summary(): the layers in call order with output shapes and parameters (Flax's tabulate),
before fit for a given input shape and after it, and the totals. trainer.export():
the inference function as serialized StableHLO with the weights inside, run by plain JAX in
another process (no easyfit, no model class), for batch sizes it was not traced with."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
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


def _rows(text: str, *names: str) -> list[int]:
    """The line of the table's row for each layer path in ``names``."""
    lines = text.splitlines()
    return [next(i for i, line in enumerate(lines) if re.match(rf"\S\s*{name}\s", line)) for name in names]


def test_summary_lists_layers_in_call_order_with_output_shapes_and_totals(trained, capsys):
    trainer, _ = trained
    assert trainer.summary() is None  # printed, not returned (Keras): shown once in a notebook
    text = capsys.readouterr().out
    kept: list[str] = []
    trainer.summary(print_fn=kept.append)
    assert kept == [text.rstrip("\n")]
    totals = [line for line in text.splitlines() if line.startswith("Total")]
    assert totals == [text.rstrip().splitlines()[-1]]  # one Total line, the last
    conv, bn, dense = _rows(text, "Conv_0", "BatchNorm_0", "Dense_0")
    assert conv < bn < dense  # the order of the calls, not of the names
    lines = text.splitlines()
    # the training data's shape, the batch axis as 1; each layer's output shape on its row
    assert "float32[1,28,28,1]" in lines[conv] and "float32[1,14,14,4]" in lines[conv]
    assert "float32[1,10]" in lines[dense]
    assert "kernel: float32[3,3,1,4]" in text and "mean: float32[4]" in text  # statistics apart
    conv, bn, dense = 3 * 3 * 4 + 4, 2 * 4, 14 * 14 * 4 * 10 + 10
    assert f"Trainable parameters: {conv + bn + dense:,}" in text
    assert "Non-trainable variables: 8 " in text


class CallOrder(nn.Module):
    """Layers whose names sort the other way round from the order they are called in; two
    inputs (a dict)."""

    @nn.compact
    def __call__(self, x):
        h = jnp.concatenate([x["image"].reshape((x["image"].shape[0], -1)), x["extra"]], axis=-1)
        h = nn.Dense(6, name="z_first")(h)
        return nn.Dense(3, name="a_last")(nn.relu(h))


class NNXCallOrder(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.a_last = nnx.Linear(6, 3, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)  # a PRNG key in the model state
        self.z_first = nnx.Linear(14, 6, rngs=rngs)

    def __call__(self, x):
        h = jnp.concatenate([x["image"].reshape((x["image"].shape[0], -1)), x["extra"]], axis=-1)
        return self.a_last(self.dropout(nnx.relu(self.z_first(h))))


@pytest.mark.parametrize("make", [CallOrder, lambda: NNXCallOrder(nnx.Rngs(0))], ids=["linen", "nnx"])
def test_summary_before_fit_builds_the_model_for_the_input_shape_given(make):
    model = make()
    trainer = ef.Trainer(model)
    with pytest.raises(RuntimeError, match=r"input_shape=\(28, 28, 1\).*or call fit first"):
        trainer.summary()
    with pytest.raises(ValueError, match=r"input_shape=28: expected one sample's shape"):
        trainer.summary(input_shape=28)
    before = None
    if isinstance(model, nnx.Module):
        call = nnx.Linear.__call__
        with pytest.raises(TypeError):  # the model fails on these inputs (14 features expected)
            trainer.summary(input_shape={"image": (5,), "extra": (2,)})
        assert nnx.Linear.__call__ is call  # nnx.tabulate's replacement taken back even so
        before = nnx.state(model, nnx.RngState)
    kept: list[str] = []
    trainer.summary(input_shape={"image": (3, 4), "extra": (2,)}, print_fn=kept.append)
    text = kept[0]
    first, last = _rows(text, "z_first", "a_last")
    lines = text.splitlines()
    assert first < last, text  # call order, not the names' order
    assert "float32[1,6]" in lines[first] and "float32[1,3]" in lines[last], text
    assert "float32[1,3,4]" in text and "float32[1,2]" in text  # both inputs
    assert f"Trainable parameters: {14 * 6 + 6 + 6 * 3 + 3:,} " in text
    assert trainer.state is None  # fit makes the parameters from its data
    if before is not None:  # the Dropout's key and count as they were: a copy ran
        after = nnx.state(model, nnx.RngState)
        for a, b in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after), strict=True):
            np.testing.assert_array_equal(_key_data(a), _key_data(b))
    # a width given: longer cells wrap, nothing cut
    kept.clear()
    trainer.summary(input_shape={"image": (3, 4), "extra": (2,)}, print_fn=kept.append, line_length=60)
    assert max(len(line) for line in kept[0].splitlines()) <= 60
    assert "…" not in kept[0]


def _key_data(a):
    return jax.random.key_data(a) if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) else a


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
    assert "float32[1,28,28,1]" in kept[0] and "float32[1,10]" in kept[0]  # the training data's shape
    if isinstance(trainer.model, nnx.Module):  # the keys counted by their key data (2 uint32 each)
        assert "RngState" in kept[0] and "Non-trainable variables: 22 (88 B)" in kept[0], kept[0]
    fn, _ = ef.persistence.export.load_exported(trainer.export(tmp_path / "exported"))
    # one batch of predict's size: the NNX model draws noise of the batch's shape
    np.testing.assert_allclose(np.asarray(fn(x[:8])), expected[:8], rtol=0, atol=1e-5)
    path = trainer.save(tmp_path / "ckpt")
    again = ef.Trainer.from_checkpoint(path, make(), optimizer=optax.adam(1e-3), precision=precision)
    np.testing.assert_allclose(again.predict(data, batch_size=8, verbose=0), expected, rtol=0, atol=1e-6)
