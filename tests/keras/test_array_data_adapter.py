"""Arrays through fit, evaluate and predict as Keras 3's
keras/src/trainers/data_adapters/array_data_adapter_test.py (and, for fit, evaluate and predict
on arrays, keras/src/trainers/trainer_test.py) pins them down; checked on what reaches the
model: the rows, labels, weights, shapes and dtypes each step sees (a trainer that records them
from inside its jitted steps), not the library's attributes.

Where easyfit differs on purpose (docs/keras.md), the test asserts easyfit's documented
behaviour and says so: a step always sees ``batch_size`` rows, the last batch's padding masked
(Keras' last batch is smaller: the valid rows are compared), ``shuffle=True`` permutes the whole
data (as Keras'), ``validation_split`` holds out a seeded random share, a list is one array
(several inputs or outputs are a tuple or a dict, one level deep), and ``class_weight`` with
``sample_weight`` multiply.

Skipped, and why:

* The ``array_type`` cases of ``test_basic_flow`` other than NumPy (tf, torch, JAX, sparse,
  ragged, pandas, scipy): easyfit takes what ``np.asarray`` takes, so dense tensors become NumPy
  arrays; sparse and ragged tensors are not supported; pandas is not installed here.
* ``test_basic_flow``'s dtypes beyond float64 -> float32 (checked below): an int64 value beyond
  int32 is refused, naming the array, where Keras' JAX backend would wrap it (docs/keras.md);
  tested in tests/data/test_arrays.py.
* ``test_tf_sparse_trailing_empty_rows``, ``test_torch_data_loader_nested_input``'s DataLoader:
  backend iterators easyfit does not have (its dict input case is ported below).
* ``test_sharding``: Keras' multi-process auto-sharding; easyfit's sharding over devices and
  processes is tested in tests/test_parallel.py and tests/test_distributed.py.
* ``test_errors``' ``class_weight`` with ``sample_weight``: easyfit multiplies them
  (tests/test_structured.py); ``class_weight`` with several outputs: refused, tested there too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

import easyfit as ef
from easyfit.errors import DataError


class Flat(nn.Module):
    """Every input array flattened and joined (4 features in all), then Dense(4); for a dict of
    inputs, a tuple of two outputs of 3 and 4 (one model, whose parameters fit both)."""

    @nn.compact
    def __call__(self, x):
        leaves = jax.tree_util.tree_leaves(x)
        h = jnp.concatenate([a.reshape((a.shape[0], -1)) for a in leaves], axis=-1)
        one, heads = nn.Dense(4)(h), (nn.Dense(3)(h), nn.Dense(4)(h))
        return heads if isinstance(x, dict) else one


def any_labels(y_true, y_pred):
    """A loss that takes labels of any shape (Seen's loss is 1 per sample whatever it is)."""
    return jnp.zeros(y_pred.shape[:1])


class Seen(ef.Trainer):
    """Records, for every step it runs (training or evaluation, in order), the valid rows of
    the batch it sees (``x``, ``y`` and ``sample_weight`` in their structure, as NumPy), and for
    training steps the sum of the weighted per-sample losses. Its loss is 1 per sample (no
    gradient): the weighted loss of a step is the sum of its rows' weights."""

    def __init__(self, *args, **kwargs):
        super().__init__(
            *args, optimizer=optax.sgd(0.0), loss=any_labels, steps_per_execution=1, seed=0, **kwargs
        )
        self.steps: list[dict] = []
        self.weights: list[float] = []
        self._mode = "eval"

    def clear(self) -> None:
        jax.effects_barrier()
        self.steps, self.weights = [], []

    def _record(self, mode, batch) -> None:
        mask = np.asarray(batch.pop("mask")).astype(bool)
        rows = jax.tree_util.tree_map(lambda a: np.asarray(a)[mask], batch)
        self.steps.append({"mode": mode, **rows})

    def compute_loss(self, outputs, batch):
        jax.debug.callback(self._record, self._mode, dict(batch))
        return super().compute_loss(outputs, batch) * 0.0 + 1.0

    def train_step(self, state, batch):
        self._mode = "train"  # read while the step is traced: a constant of the training step
        try:
            new, metrics = super().train_step(state, batch)
        finally:
            self._mode = "eval"
        jax.debug.callback(lambda total: self.weights.append(float(total)), metrics.loss.total)
        return new, metrics

    def seen(self, mode: str = "train") -> list[dict]:
        jax.effects_barrier()
        return [s for s in self.steps if s["mode"] == mode]


@pytest.fixture(scope="module")
def seen():
    """One recording trainer for the module (its steps compile once per layout of the data)."""
    return Seen(Flat())


@pytest.fixture
def trainer(seen):
    seen.clear()
    return seen


def indexed(n: int, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """Keras' make_array: ``x[i] == [i] * 4``, ``y[i] == [i] * 4`` (float regression targets)."""
    x = np.repeat(np.arange(n, dtype=dtype)[:, None], 4, axis=1)
    return x, x.astype(np.float32)


def order(steps: list[dict]) -> list[int]:
    return [int(v) for s in steps for v in s["x"][:, 0]]


# ------------------------------------------------------------------------------- batches
@pytest.mark.parametrize("shuffle", [False, "batch", True])
def test_basic_flow(trainer, shuffle):
    # keras: array_data_adapter_test.py::test_basic_flow (np, float64, each shuffle): 34
    # samples in batches of 16 are 3 steps of 16, 16 and 2 rows (easyfit pads the last batch
    # to 16 rows and masks the padding: the step's valid rows are these), x float32, labels
    # paired with their inputs, every sample once per epoch; "batch" keeps each batch's samples.
    x, y = indexed(34)
    trainer.fit(x, y, batch_size=16, epochs=2, shuffle=shuffle, verbose=0)
    steps = trainer.seen()
    assert [len(s["x"]) for s in steps] == [16, 16, 2] * 2
    for s in steps:
        assert s["x"].dtype == np.float32 and s["x"].shape[1:] == (4,)
        assert s["y"].dtype == np.float32 and s["y"].shape[1:] == (4,)
        np.testing.assert_array_equal(s["x"], s["y"])  # x_order == y_order
    epochs = [order(steps[:3]), order(steps[3:])]
    for epoch in epochs:
        assert sorted(epoch) == list(range(34))  # each sample once, none twice
    if shuffle == "batch":
        for s, start in zip(steps, [0, 16, 32] * 2, strict=True):
            assert sorted(order([s])) == list(range(start, start + len(s["x"])))
    if shuffle:
        assert epochs[0] != list(range(34)) and epochs[0] != epochs[1]
    else:
        assert epochs == [list(range(34))] * 2


def test_multi_inputs_and_outputs(trainer):
    # keras: array_data_adapter_test.py::test_multi_inputs_and_outputs (x a dict, y several
    # arrays, sample_weight; shuffle=False): each step sees the dict and the outputs' arrays
    # with 16, 16 then 2 valid rows of the right shapes, float32, and each row's weight. Keras
    # takes y as a list; easyfit takes several outputs as a tuple (a list is one array, as in
    # NumPy: these arrays of different shapes are refused, naming the tuple).
    rng = np.random.default_rng(0)
    n = 34
    x1 = np.arange(n, dtype=np.float64)[:, None]  # carries the sample's index
    x = {"x1": x1, "x2": rng.random((n, 3))}
    y1, y2 = rng.random((n, 3)), rng.random((n, 4))
    sw = rng.random(n)
    trainer.fit(x, (y1, y2), sample_weight=sw, batch_size=16, shuffle=False, verbose=0)
    steps = trainer.seen()
    assert [len(s["x"]["x1"]) for s in steps] == [16, 16, 2]
    for s in steps:
        i = s["x"]["x1"][:, 0].astype(int)
        assert sorted(s["x"]) == ["x1", "x2"] and isinstance(s["y"], tuple) and len(s["y"]) == 2
        assert s["x"]["x1"].dtype == s["y"][0].dtype == s["sample_weight"].dtype == np.float32
        assert s["x"]["x2"].shape == (len(i), 3) and s["sample_weight"].shape == (len(i),)
        np.testing.assert_allclose(s["x"]["x2"], x["x2"][i], rtol=1e-6)
        np.testing.assert_allclose(s["y"][0], y1[i], rtol=1e-6)
        np.testing.assert_allclose(s["y"][1], y2[i], rtol=1e-6)
        np.testing.assert_allclose(s["sample_weight"], sw[i], rtol=1e-6)
    assert order_of(steps) == list(range(n))
    with pytest.raises(DataError, match=r"y: a list whose items differ in shape .* a dict or a tuple"):
        trainer.fit(x, [y1, y2], verbose=0)


def order_of(steps: list[dict]) -> list[int]:
    return [int(v) for s in steps for v in s["x"]["x1"][:, 0]]


@pytest.mark.parametrize("encoding", ["int", "categorical"])
def test_class_weights(trainer, encoding):
    # keras: array_data_adapter_test.py::test_class_weights (int and one-hot labels of 4
    # classes, {0: .1, 1: .2, 2: .3, 3: .4}): each sample's loss is weighed by its class's
    # weight (batches of one sample: a step's weighted loss is its sample's weight). The int
    # labels are 1-D int64, as NumPy makes them (Keras' are (n, 1), tests/keras/
    # test_class_weight.py): each step sees them 1-D, as int32, as Keras keeps a 1-D array.
    x = np.arange(4, dtype=np.float32)[:, None].repeat(4, axis=1)
    y = np.arange(4) if encoding == "int" else np.eye(4, dtype=np.float32)
    weights = {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4}
    trainer.fit(x, y, class_weight=weights, batch_size=1, verbose=0)
    steps = trainer.seen()
    got = {int(s["x"][0, 0]): w for s, w in zip(steps, trainer.weights, strict=True)}
    assert got == pytest.approx(weights, rel=1e-6)
    for s in steps:
        i = int(s["x"][0, 0])
        if encoding == "int":
            assert s["y"].dtype == np.int32 and s["y"].tolist() == [i]
        else:
            assert s["y"].dtype == np.float32 and s["y"].tolist() == [np.eye(4)[i].tolist()]


def test_errors(trainer):
    # keras: array_data_adapter_test.py::test_errors ("Expected all elements of `x` to be
    # array-like"): easyfit names the argument. A string x is a path to data (a folder), so
    # easyfit says that it is not one.
    x, y = indexed(4)
    with pytest.raises(DataError, match="Invalid: no such directory"):
        trainer.fit("Invalid", verbose=0)
    with pytest.raises(DataError, match="x has 4 samples but y has no"):
        trainer.fit(x, "Invalid", verbose=0)
    with pytest.raises(DataError, match="sample_weight: expected one number per sample"):
        trainer.fit(x, y, sample_weight="Invalid", verbose=0)
    # Keras takes any nesting; easyfit one level (docs/keras.md), and names what is deeper
    with pytest.raises(DataError, match=r"x\['a'\]: a dict inside a dict"):
        trainer.fit({"a": {"b": x}}, y, verbose=0)


@pytest.mark.parametrize(
    "method, data",
    [
        ("fit", lambda x, y: ((x[i : i + 2], y[i : i + 2]) for i in range(0, 4, 2))),
        ("predict", lambda x, y: ((x[i : i + 2],) for i in range(0, 4, 2))),
        ("evaluate", lambda x, y: iter([(x, y)])),
    ],
)
def test_generators_are_refused_saying_what_is_supported(trainer, method, data):
    # keras: trainer_test.py::test_fit_with_data_adapter (generators, PyDataset, tf.data,
    # torch and grain loaders) and test_predict_generator: easyfit reads samples by index, so
    # an iterable of batches is refused with a TypeError that lists what is supported
    # (docs/data.md, "What fit accepts"); nothing reaches a step.
    x, y = indexed(4)
    with pytest.raises(TypeError, match=r"^x: a Python (generator|iterator) of batches .*Supported: "):
        getattr(trainer, method)(data(x, y), verbose=0)
    assert trainer.seen("train") == trainer.seen("eval") == []


def test_a_dataset_object_is_refused(trainer):
    # keras: trainer_test.py::test_fit_with_data_adapter ("py_dataset": an object with
    # __getitem__ giving batches and __len__)
    class Batches:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return indexed(4)

    with pytest.raises(TypeError, match=r"^x: a dataset object \(Batches\) is not supported.*Supported: "):
        trainer.fit(Batches(), verbose=0)


# ------------------------------------------------------------------- fit, evaluate, predict
def test_fit_with_val_split(trainer):
    # keras: trainer_test.py::test_fit_with_val_split (and Trainer.fit's
    # train_validation_split): of 32 rows, validation_split=0.2 holds out
    # 32 - floor(32 * 0.8) = 7, as Keras counts. easyfit holds out a seeded random 7, not the
    # last 7 (docs/keras.md): each epoch trains on the other 25, each once, and every
    # validation sees the same 7 (tests/keras/test_trainer.py: a second fit holds out the same).
    x, y = indexed(32)
    trainer.fit(x, y, batch_size=8, epochs=2, validation_split=0.2, verbose=0)
    train, val = trainer.seen("train"), trainer.seen("eval")
    assert [len(s["x"]) for s in train] == [8, 8, 8, 1] * 2
    assert [len(s["x"]) for s in val] == [7, 7]
    held = sorted(order(val[:1]))
    assert sorted(order(val[1:])) == held and held != list(range(25, 32))
    for epoch in (train[:4], train[4:]):
        assert sorted(order(epoch) + held) == list(range(32))


def test_evaluate_flow_and_steps(trainer):
    # keras: trainer_test.py::test_evaluate_flow, and Trainer.evaluate's steps: evaluate sees
    # every row once, in the data's order, the last batch partial (16, 16 and 2 rows of 34);
    # steps=2 the first two batches.
    x, y = indexed(34)
    trainer.evaluate(x, y, batch_size=16, verbose=0)
    trainer.evaluate(x, y, batch_size=16, steps=2, verbose=0)
    steps = trainer.seen("eval")
    assert [len(s["x"]) for s in steps] == [16, 16, 2, 16, 16]
    assert order(steps[:3]) == list(range(34)) and order(steps[3:]) == list(range(32))


def test_predict_flow_order_and_steps(trainer):
    # keras: trainer_test.py::test_predict_flow and test_predict_preserve_order (batches that
    # do not divide the data: here 34 rows in batches of 16), and Trainer.predict's steps: one
    # float32 output row per sample, in the data's order; steps=2 the first 32.
    x = np.random.default_rng(0).random((34, 4))
    out = trainer.predict(x, batch_size=16, verbose=0)
    dense = trainer.params["Dense_0"]
    expected = x.astype(np.float32) @ np.asarray(dense["kernel"]) + np.asarray(dense["bias"])
    assert out.shape == (34, 4) and out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    first = trainer.predict(x, batch_size=16, steps=2, verbose=0)
    np.testing.assert_allclose(first, expected[:32], rtol=1e-5, atol=1e-6)


def test_nested_input_predict(trainer):
    # keras: trainer_test.py::test_nested_input_predict: a tuple, or a dict, of inputs reaches
    # the model as such, and predict gives one row per sample (here the model answers a dict
    # with a tuple of two outputs: predict returns that tuple). Keras' list of inputs is one
    # array in easyfit (docs/keras.md): two samples of shape (3, 2) here, which the model built
    # on other inputs refuses.
    rng = np.random.default_rng(0)
    x1, x2 = rng.random((2, 3, 2))
    assert trainer.predict((x1, x2), verbose=0).shape == (3, 4)
    with pytest.raises(DataError, match=r"model was built for samples .* received samples of shape \(3, 2\)"):
        trainer.predict([x1, x2], verbose=0)
    heads = trainer.predict({"a": x1[:, :1], "b": rng.random((3, 3))}, verbose=0)
    assert isinstance(heads, tuple) and [h.shape for h in heads] == [(3, 3), (3, 4)]
