"""Losses and metrics by Keras name, callables and clu metrics: evaluate agrees with NumPy
computations on predict's outputs (every sample once, padding excluded: 250 is not a multiple of
the batch)."""

from __future__ import annotations

import numpy as np
import optax
import pytest
from clu import metrics as clu_metrics
from flax import linen as nn

import easyfit as ef


class Dense(nn.Module):
    outputs: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.outputs)(nn.relu(nn.Dense(32)(x.reshape((x.shape[0], -1)))))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(250, 8)).astype(np.float32)
    w = rng.normal(size=(8, 10)).astype(np.float32)
    return x, (x @ w).argmax(-1).astype(np.int32), (x @ w).astype(np.float32)


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _fit(outputs, loss, metrics, x, y):
    trainer = ef.Trainer(Dense(outputs), optimizer=optax.adam(1e-2), loss=loss, metrics=metrics, seed=0)
    trainer.fit(x, y, epochs=2, batch_size=32, verbose=0)
    return trainer, trainer.evaluate(x, y, batch_size=32), trainer.predict(x, batch_size=32)


def test_sparse_and_categorical_crossentropy_accuracy_and_top_k(data):
    x, labels, _ = data
    for loss, y in (
        ("sparse_categorical_crossentropy", labels),
        ("categorical_crossentropy", np.eye(10, dtype=np.float32)[labels]),
        ("categorical_crossentropy", labels),
    ):  # integer labels are one-hot encoded
        _, result, logits = _fit(10, loss, ["accuracy", "top_k_accuracy"], x, y)
        expected_loss = -_log_softmax(logits.astype(np.float64))[np.arange(250), labels].mean()
        assert result["loss"] == pytest.approx(expected_loss, rel=1e-4)
        assert result["accuracy"] == pytest.approx((logits.argmax(-1) == labels).mean(), abs=1e-6)
        rank = (logits > logits[np.arange(250), labels][:, None]).sum(-1)
        assert result["top_k_accuracy"] == pytest.approx((rank < 5).mean(), abs=1e-6)  # k=5
        assert result["top_k_accuracy"] > result["accuracy"]


def test_binary_crossentropy_and_accuracy(data):
    x, labels, _ = data
    y = (labels % 2).astype(np.float32)
    _, result, logits = _fit(1, "binary_crossentropy", ["accuracy"], x, y)
    z = logits[:, 0].astype(np.float64)
    expected = np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z))))
    assert result["loss"] == pytest.approx(expected, rel=1e-4)
    assert result["accuracy"] == pytest.approx(((z > 0) == (y > 0.5)).mean(), abs=1e-6)


def test_regression_mse_and_mae(data):
    x, _, targets = data
    for loss in ("mse", "mae"):
        _, result, out = _fit(10, loss, ["mse", "mae"], x, targets)
        err = out.astype(np.float64) - targets
        assert result["mse"] == pytest.approx((err**2).mean(), rel=1e-4)
        assert result["mae"] == pytest.approx(np.abs(err).mean(), rel=1e-4)
        assert result["loss"] == pytest.approx(result[loss], rel=1e-5)


def test_callable_loss_and_metric_and_clu_metric(data):
    x, labels, _ = data

    def hinge(outputs, labels):  # per-sample, as optax losses
        return optax.losses.multiclass_hinge_loss(outputs, labels)

    def wrong(outputs, labels):
        return (outputs.argmax(-1) != labels).astype(np.float32)

    _, result, logits = _fit(10, hinge, [wrong, clu_metrics.Accuracy], x, labels)
    assert set(result) == {"loss", "wrong", "accuracy"}
    accuracy = (logits.argmax(-1) == labels).mean()
    assert result["wrong"] == pytest.approx(1 - accuracy, abs=1e-6)
    assert result["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    margins = logits - logits[np.arange(250), labels][:, None] + 1.0
    margins[np.arange(250), labels] = 0.0
    assert result["loss"] == pytest.approx(margins.max(-1).mean(), rel=1e-4)


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="loss='hinge'"):
        ef.Trainer(Dense(2), loss="hinge").fit(np.zeros((4, 2)), np.zeros(4, np.int32), verbose=0)
    with pytest.raises(ValueError, match="unknown metric 'f1'"):
        ef.Trainer(Dense(2), metrics=["f1"]).fit(np.zeros((4, 2)), np.zeros(4, np.int32), verbose=0)
