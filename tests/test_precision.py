"""Mixed precision: bfloat16 and float16 passes on float32 master weights, loss scaling, and
checkpoints that load across precisions. Real data: the packaged MNIST sample."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

import easyfit as ef
from easyfit.core.metrics import build_collection
from easyfit.core.models import adapt
from easyfit.core.precision import get_precision
from easyfit.core.state import TrainState
from easyfit.training import steps
from tests.helpers.models import NormedCNN


class NNXNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(784, 32, rngs=rngs)
        self.norm = nnx.BatchNorm(32, rngs=rngs)
        self.out = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.norm(self.hidden(x.reshape((x.shape[0], -1))))))


@pytest.fixture(scope="module")
def data():
    sample = ef.datasets.sample()
    (x, y), (xv, yv) = sample["train"], sample["val"]
    return (
        ef.data.Arrays(x[:2000], y[:2000], scale=1 / 255),
        ef.data.Arrays(xv[:500], yv[:500], scale=1 / 255),
    )


def _dtypes(tree) -> set[str]:
    return {str(a.dtype) for a in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(a.dtype, jnp.floating)}


def test_names_and_refusal():
    assert get_precision("mixed_float16").name == "float16"
    assert get_precision("bf16").compute_dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="precision='int8'.*bfloat16"):
        ef.Trainer(NormedCNN(), precision="int8")


def test_bfloat16_matches_float32_accuracy_and_keeps_float32_state(data):
    train, val = data
    accuracy = {}
    for precision in ("float32", "bfloat16"):
        trainer = ef.Trainer(NormedCNN(), optimizer=optax.adam(3e-3), precision=precision, seed=0)
        history = trainer.fit(train, epochs=2, batch_size=100, validation_data=val, verbose=0)
        accuracy[precision] = history.history["val_accuracy"][-1]
        # master parameters, optimizer state and BatchNorm statistics stay float32
        assert _dtypes(trainer.state.params) == {"float32"}
        assert _dtypes(trainer.state.opt_state) == {"float32"}
        assert _dtypes(trainer.state.model_state) == {"float32"}
        assert trainer.predict(val).dtype == np.float32
    assert accuracy["float32"] > 0.8
    assert abs(accuracy["bfloat16"] - accuracy["float32"]) < 0.03, accuracy


def test_bfloat16_passes_really_run_in_bfloat16(data):
    """The forward pass sees bfloat16 inputs and weights (not float32 relabelled)."""
    seen = []

    class Probe(nn.Module):
        @nn.compact
        def __call__(self, x):
            seen.append(x.dtype)
            return nn.Dense(10)(x.reshape((x.shape[0], -1)))

    trainer = ef.Trainer(Probe(), precision="bfloat16")
    trainer.fit(data[0], epochs=1, batch_size=500, verbose=0)
    assert jnp.bfloat16 in seen


def test_nnx_model_in_bfloat16(data):
    train, val = data
    trainer = ef.Trainer(NNXNet(nnx.Rngs(0)), optimizer=optax.adam(3e-3), precision="bfloat16")
    history = trainer.fit(train, epochs=2, batch_size=100, validation_data=val, verbose=0)
    assert history.history["val_accuracy"][-1] > 0.75
    assert _dtypes(trainer.state.params) == {"float32"}
    assert _dtypes(trainer.state.model_state) <= {"float32"}


def test_float16_skips_a_step_with_infinite_gradients():
    """x = 70,000 overflows float16 (max 65,504): the gradients are not finite, so the step
    leaves parameters and optimizer state as they were and halves the scale."""
    model = nn.Dense(3)
    adapter, _ = adapt(model)
    precision = get_precision("float16")
    params, model_state = adapter.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
    tx = optax.sgd(0.1)
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        model_state=model_state,
        rng=jax.random.PRNGKey(1),
        dynamic_scale=precision.initial_scale(),
    )
    mse = ef.core.losses.get_loss("mse")
    step = jax.jit(
        steps.make_train_step(
            adapter, tx, lambda out, batch: mse(out, batch["y"]), build_collection([]), None, precision
        )
    )
    labels = jnp.zeros((2, 3))
    mask = jnp.ones((2,), bool)
    bad = {"x": jnp.full((2, 4), 7e4), "y": labels, "mask": mask}
    after, _ = step(state, bad)
    np.testing.assert_array_equal(after.params["kernel"], state.params["kernel"])
    assert float(after.dynamic_scale.scale) == float(state.dynamic_scale.scale) / 2
    assert int(after.step) == 1
    good = {"x": jnp.ones((2, 4)), "y": labels, "mask": mask}
    later, _ = step(after, good)
    assert not np.array_equal(np.asarray(later.params["kernel"]), np.asarray(params["kernel"]))
    assert float(later.dynamic_scale.scale) == float(after.dynamic_scale.scale)
    assert int(later.dynamic_scale.fin_steps) == 1


def test_float16_trains_and_logs_the_scale(data):
    train, val = data
    trainer = ef.Trainer(NormedCNN(), optimizer=optax.adam(3e-3), precision="float16")
    history = trainer.fit(train, epochs=2, batch_size=100, validation_data=val, verbose=0)
    assert history.history["val_accuracy"][-1] > 0.75
    assert history.history["loss_scale"][-1] > 0
    assert _dtypes(trainer.state.params) == {"float32"}


@pytest.mark.parametrize(
    "first, second", [("bfloat16", "float32"), ("float32", "float16"), ("float16", "float32")]
)
def test_checkpoints_load_across_precisions(data, tmp_path, first, second):
    train, val = data
    trainer = ef.Trainer(NormedCNN(), optimizer=optax.adam(1e-3), precision=first)
    trainer.fit(train, epochs=1, batch_size=250, verbose=0)
    path = trainer.save(tmp_path / "ckpt")
    again = ef.Trainer(NormedCNN(), optimizer=optax.adam(1e-3), precision=second)
    again.load(path)
    for a, b in zip(
        jax.tree_util.tree_leaves(trainer.state.params), jax.tree_util.tree_leaves(again.state.params)
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # exact: both float32
    assert (again.state.dynamic_scale is None) == (second != "float16")
    if first == second == "float16":
        assert float(again.state.dynamic_scale.scale) == float(trainer.state.dynamic_scale.scale)
    # and it trains on from there
    again.fit(train, epochs=1, batch_size=250, verbose=0)
