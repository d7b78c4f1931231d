"""Structured batches, per-output losses, sample weights and a custom train_step, run through
fit / evaluate / predict on whatever devices the process has (tests/test_structured.py runs it
in-process on one device and in tests/programs/structured_devices.py on four).

:func:`run_all` returns plain values (JSON-able): what easyfit logged beside what NumPy computes
from the model's outputs, and the trained parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax import nnx

import easyfit as ef

#: 110 samples at batch 40: three steps per epoch, the last one with 10 padding rows.
N, BATCH = 110, 40
KIND_WEIGHT, BOX_WEIGHT = 1.0, 0.5
CLASS_WEIGHT = {0: 1.0, 1: 2.0, 2: 0.5}


class TwoHeads(nn.Module):
    """Two inputs (a small image and a vector) to two outputs (class logits and a box of 4);
    a dict in and out, or a tuple in and out."""

    tuples: bool = False

    @nn.compact
    def __call__(self, x):
        image, extra = x if self.tuples else (x["image"], x["extra"])
        h = jnp.concatenate([image.reshape((image.shape[0], -1)), extra], axis=-1)
        h = nn.relu(nn.Dense(16)(h))
        kind, box = nn.Dense(3)(h), nn.Dense(4)(h)
        return (kind, box) if self.tuples else {"kind": kind, "box": box}


class NNXTwoInputs(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.image = nnx.Linear(16, 8, rngs=rngs)
        self.extra = nnx.Linear(3, 8, rngs=rngs)
        self.out = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        h = self.image(x["image"].reshape((x["image"].shape[0], -1))) + self.extra(x["extra"])
        return self.out(nnx.relu(h))


class TwoUpdates(ef.Trainer):
    """A custom train_step: two of easyfit's updates per batch; counts its traces."""

    traces = 0

    def train_step(self, state, batch):
        type(self).traces += 1  # Python runs when the step is traced, not at every step
        state, metrics = super().train_step(state, batch)
        return super().train_step(state, batch)[0], metrics


class FrozenFirst(ef.Trainer):
    """A custom train_step from the parts: the first layer's gradients are dropped."""

    frozen = "layers_0"

    def train_step(self, state, batch):
        rng = jax.random.fold_in(state.rng, state.step)

        def objective(params):
            outputs, model_state = self.forward(params, state.model_state, batch["x"], train=True, rng=rng)
            per_sample = self.compute_loss(outputs, batch)
            return ef.training.masked_mean(per_sample, batch["mask"]), (outputs, per_sample, model_state)

        grads, (outputs, per_sample, model_state) = jax.grad(objective, has_aux=True)(state.params)
        grads = {**grads, self.frozen: jax.tree_util.tree_map(jnp.zeros_like, grads[self.frozen])}
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        state = state.replace(
            step=state.step + 1,
            params=optax.apply_updates(state.params, updates),
            opt_state=opt_state,
            model_state=model_state,
        )
        return state, self.compute_metrics(outputs, batch, per_sample)


def data(seed: int = 0) -> dict:
    """Two inputs, two outputs (an integer class and a float box), one weight per sample."""
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.5, 2.0, N).astype(np.float32)
    weights[::5] = 0.0
    return {
        "x": {
            "image": rng.integers(0, 4, (N, 4, 4, 1)).astype(np.uint8),
            "extra": rng.normal(size=(N, 3)).astype(np.float32),
        },
        "y": {
            "kind": rng.integers(0, 3, N).astype(np.int32),
            "box": rng.normal(size=(N, 4)).astype(np.float32),
        },
        "sample_weight": weights,
    }


def _ce(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(-1)) + top[:, 0]
    return lse - logits[np.arange(len(labels)), labels]


def expected(out: dict, y: dict, sample_weight: np.ndarray | None = None) -> dict:
    """The logs computed with NumPy (float64) from the model's outputs: Keras' reduction, the
    mean over the rows of ``weight * loss``; per-output losses unweighted by the loss weights;
    metrics unweighted."""
    w = np.ones(N) if sample_weight is None else sample_weight.astype(np.float64)
    kind = _ce(out["kind"], y["kind"])
    box = ((out["box"].astype(np.float64) - y["box"]) ** 2).mean(-1)
    return {
        "loss": float((w * (KIND_WEIGHT * kind + BOX_WEIGHT * box)).mean()),
        "kind_loss": float((w * kind).mean()),
        "box_loss": float((w * box).mean()),
        "kind_accuracy": float((out["kind"].argmax(-1) == y["kind"]).mean()),
        "box_mae": float(np.abs(out["box"] - y["box"]).mean()),
    }


def _logs(history: ef.callbacks.History) -> dict:
    return {k: v for k, v in history.history.items() if k != "input_wait"}


def _flat(tree) -> list[float]:
    return np.concatenate([np.asarray(a).ravel() for a in jax.tree_util.tree_leaves(tree)]).tolist()


def two_heads(optimizer, tuples: bool = False, **kwargs) -> ef.Trainer:
    names = ("output_0", "output_1") if tuples else ("kind", "box")
    losses = ["sparse_categorical_crossentropy", "mse"]
    return ef.Trainer(
        TwoHeads(tuples=tuples),
        optimizer=optimizer,
        loss=losses if tuples else dict(zip(names, losses)),
        loss_weights=[KIND_WEIGHT, BOX_WEIGHT] if tuples else {"kind": KIND_WEIGHT, "box": BOX_WEIGHT},
        metrics=[["accuracy"], ["mae"]] if tuples else {"kind": ["accuracy"], "box": "mae"},
        seed=0,
        **kwargs,
    )


def run_all() -> dict:
    d = data()
    x, y, sw = d["x"], d["y"], d["sample_weight"]
    results: dict = {"devices": jax.device_count()}

    # Per-output losses and metrics. A learning rate of zero keeps the parameters: what fit
    # logs is then a function of predict's outputs. Epoch 2 comes from the device cache.
    with two_heads(optax.sgd(0.0)) as t:
        history = t.fit(x, y, batch_size=BATCH, epochs=2, validation_data=(x, y, sw), verbose=0, cache=True)
        out = t.predict(x, batch_size=BATCH)
        results["dict"] = {
            "logs": _logs(history),
            "evaluate": t.evaluate(x, y, batch_size=BATCH, sample_weight=sw),
            "expected": expected(out, y),
            "expected_weighted": expected(out, y, sw),
            "predict_shapes": {k: list(v.shape) for k, v in out.items()},
        }

    # The same with tuples in and out.
    xt, yt = (x["image"], x["extra"]), (y["kind"], y["box"])
    with two_heads(optax.sgd(0.0), tuples=True) as t:
        history = t.fit(xt, yt, batch_size=BATCH, epochs=1, verbose=0, sample_weight=sw)
        kind, box = t.predict(xt, batch_size=BATCH)
        results["tuple"] = {
            "logs": _logs(history),
            "expected": expected({"kind": kind, "box": box}, y, sw),
        }

    # Trained for real: the parameters (compared across device counts) and the loss falling.
    with two_heads(optax.sgd(0.1)) as t:
        history = t.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, sample_weight=sw, cache=False)
        results["trained"] = {"loss": history.history["loss"], "params": _flat(t.params)}

    # sample_weight with class_weight on one output: they multiply.
    xs, ys = x["extra"], y["kind"]
    with ef.Trainer(nn.Dense(3), optimizer=optax.sgd(0.0), seed=0) as t:
        history = t.fit(
            xs,
            ys,
            batch_size=BATCH,
            verbose=0,
            sample_weight=sw,
            class_weight=CLASS_WEIGHT,
            validation_data=(xs, ys, sw),
        )
        logits = t.predict(xs, batch_size=BATCH)
        ce = _ce(logits, ys)
        cw = np.array([CLASS_WEIGHT[c] for c in range(3)])[ys]
        results["weights"] = {
            "logs": _logs(history),
            "evaluate": t.evaluate(xs, ys, batch_size=BATCH, sample_weight=sw),
            "expected_train": float((cw * sw * ce).mean()),
            "expected_val": float((sw * ce).mean()),
            "expected_accuracy": float((logits.argmax(-1) == ys).mean()),
        }

    # A sample of weight zero is ignored: changing its inputs and labels changes nothing.
    def trained(xs, ys):
        with ef.Trainer(nn.Dense(3), optimizer=optax.sgd(0.5), seed=0) as t:
            t.fit(xs, ys, batch_size=BATCH, epochs=2, verbose=0, sample_weight=sw)
            return _flat(t.params)

    zero = sw == 0
    other_x, other_y = xs.copy(), ys.copy()
    other_x[zero] = 100.0
    other_y[zero] = (ys[zero] + 1) % 3
    results["zero_weights"] = {"same": trained(xs, ys), "changed": trained(other_x, other_y)}

    # A custom train_step runs inside the jitted chunk (2 steps per dispatch here).
    TwoUpdates.traces = 0
    with TwoUpdates(nn.Dense(3), optimizer=optax.sgd(0.1), seed=0, steps_per_execution=2) as t:
        history = t.fit(xs, ys, batch_size=BATCH, epochs=2, verbose=0)
        results["two_updates"] = {
            "step": int(t.state.step),
            "traces": TwoUpdates.traces,
            "logs": sorted(_logs(history)),
        }
    frozen_model = nn.Sequential([nn.Dense(8), nn.relu, nn.Dense(3)])
    with FrozenFirst(frozen_model, optimizer=optax.sgd(0.5), seed=0) as t:
        t.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0)
        before = jax.device_get(t.params)
        history = t.fit(xs, ys, batch_size=BATCH, epochs=2, verbose=0)
        after = jax.device_get(t.params)
        results["frozen"] = {
            "first_kept": _flat(before["layers_0"]) == _flat(after["layers_0"]),
            "last_moved": _flat(before["layers_2"]) != _flat(after["layers_2"]),
            "logs": sorted(_logs(history)),
        }

    # NNX with a dict of inputs.
    with ef.Trainer(NNXTwoInputs(nnx.Rngs(0)), optimizer=optax.adam(1e-2), seed=0) as t:
        history = t.fit(x, y["kind"], batch_size=BATCH, epochs=2, verbose=0)
        results["nnx"] = {"loss": history.history["loss"], "predict": list(t.predict(x).shape)}
    return results
