"""Functions given as ``loss=`` or in ``metrics=``, as Keras calls them: ``fn(y_true, y_pred)``.

Keras wraps such a function in ``LossFunctionWrapper`` or ``MeanMetricWrapper``
(keras/src/trainers/compile_utils.py) and calls it with the labels first; trainer_test.py's
``test_evaluate_return_list_respect_metrics_order`` passes metrics written that way. Each test
here uses a function that is not symmetric in its arguments, on real MNIST images, and checks the
value against NumPy on ``predict``'s outputs, so that swapped arguments fail.

optax's own losses take ``(predictions, targets)``: passed directly they are called in optax's
order, and a function whose first parameter is named like the model's outputs (``y_pred``,
``outputs``, ``logits``, ...; easyfit's earlier convention) in the order its names say.

Skipped, and why: Keras' ``Loss`` and ``Metric`` objects (``keras.losses.*``,
``keras.metrics.*``); easyfit takes Keras' names as strings, clu metric classes and optax losses
instead (tests/test_metrics.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

import easyfit as ef


class MLP(nn.Module):
    outputs: int = 10

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.outputs)(nn.relu(nn.Dense(32)(x.reshape((x.shape[0], -1)))))


@pytest.fixture(scope="module")
def mnist():
    x, y = ef.datasets.sample()["train"]
    return x[:250].astype(np.float32) / 255, y[:250].astype(np.int32)


def _evaluate(model, loss, metrics, x, y):
    """``evaluate`` and ``predict`` on the same samples (250: the last batch of 32 is padded,
    and padding must not count); the loss of evaluate is the one training minimises."""
    trainer = ef.Trainer(model, loss=loss, metrics=metrics, seed=0)
    return trainer.evaluate(x, y, batch_size=32), trainer.predict(x, batch_size=32).astype(np.float64)


def _cross_entropy(logits, labels):
    z = logits - logits.max(-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -log_p[np.arange(len(labels)), labels]


def test_metric_gets_y_true_first(mnist):
    # Keras: MeanMetricWrapper calls fn(y_true, y_pred) (the metrics of
    # test_evaluate_return_list_respect_metrics_order): the labels' mean, and a metric that is
    # 1.0 when its first argument holds the integer labels (0.0 with the arguments swapped).
    x, y = mnist

    def label_mean(y_true, y_pred):
        return y_true.astype(jnp.float32)

    def first_is_labels(y_true, y_pred):
        ok = jnp.issubdtype(y_true.dtype, jnp.integer) and y_pred.shape[-1] == 10
        return jnp.full(y_true.shape[:1], float(ok))

    result, _ = _evaluate(MLP(), "sparse_categorical_crossentropy", [label_mean, first_is_labels], x, y)
    assert result["label_mean"] == pytest.approx(y.mean(), rel=1e-6)
    assert result["first_is_labels"] == 1.0


def test_loss_gets_y_true_first(mnist):
    # Keras: LossFunctionWrapper calls fn(y_true, y_pred)
    x, y = mnist

    def keras_style(y_true, y_pred):  # cross-entropy with a weight on the label's class
        return optax.softmax_cross_entropy_with_integer_labels(y_pred, y_true) * (1.0 + y_true)

    result, logits = _evaluate(MLP(), keras_style, [], x, y)
    expected = (_cross_entropy(logits, y) * (1.0 + y)).mean()
    assert result["loss"] == pytest.approx(expected, rel=1e-4)


def test_optax_loss_passed_directly(mnist):
    # Keras: LossFunctionWrapper (a function as loss=); optax's losses take (logits, labels)
    # and are called so: softmax_cross_entropy_with_integer_labels, and softmax_cross_entropy
    # on one-hot labels.
    x, y = mnist
    result, logits = _evaluate(MLP(), optax.softmax_cross_entropy_with_integer_labels, [], x, y)
    assert result["loss"] == pytest.approx(_cross_entropy(logits, y).mean(), rel=1e-4)
    one_hot = np.eye(10, dtype=np.float32)[y]
    result, logits = _evaluate(MLP(), optax.softmax_cross_entropy, [], x, one_hot)
    assert result["loss"] == pytest.approx(_cross_entropy(logits, y).mean(), rel=1e-4)


def test_optax_binary_loss_on_labels_of_rank_one(mnist):
    # Keras: squeeze_or_expand_to_same_rank (keras/src/losses/loss.py) before a loss function:
    # labels (n,) against outputs (n, 1) are expanded, not broadcast to (n, n).
    x, y = mnist
    odd = (y % 2).astype(np.float32)
    loss = functools.partial(optax.sigmoid_binary_cross_entropy)
    result, logits = _evaluate(MLP(1), loss, [], x, odd)
    z = logits[:, 0]
    expected = np.maximum(z, 0) - z * odd + np.log1p(np.exp(-np.abs(z)))
    assert result["loss"] == pytest.approx(expected.mean(), rel=1e-4)


def test_per_element_values_are_averaged_per_sample(mnist):
    # Keras: the "sum_over_batch_size" reduction of a loss returning one value per element:
    # the mean over every element (each sample has as many).
    x, y = mnist
    targets = np.stack([y, 9 - y], axis=1).astype(np.float32)

    def over(y_true, y_pred):  # squared error where the prediction is too large, else 0
        return jax.nn.relu(y_pred - y_true) ** 2

    result, outputs = _evaluate(MLP(2), over, [], x, targets)
    assert result["loss"] == pytest.approx((np.maximum(outputs - targets, 0) ** 2).mean(), rel=1e-4)


def test_functions_named_outputs_first_keep_their_order(mnist):
    # No Keras test: a deliberate difference (docs/keras.md, fit, evaluate and predict). Keras
    # has no such rule; easyfit's earlier convention, (outputs, labels), is kept for
    # functions whose first parameter says so, so that none is silently swapped.
    x, y = mnist

    def label_mean(outputs, labels):
        return labels.astype(jnp.float32)

    def loss(logits, labels):
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels)

    result, logits = _evaluate(MLP(), loss, [label_mean], x, y)
    assert result["label_mean"] == pytest.approx(y.mean(), rel=1e-6)
    assert result["loss"] == pytest.approx(_cross_entropy(logits, y).mean(), rel=1e-4)


def test_one_value_per_batch_is_refused(mnist):
    # Keras: reduction_metrics_test.py::MetricWrapperTest (a function's values averaged).
    # A deliberate difference (docs/keras.md): Keras averages a metric's batch values; easyfit
    # averages per-sample values over the valid rows (padding rows of a last batch must not
    # count), and says so for a scalar.
    x, y = mnist

    def batch_mean(y_true, y_pred):
        return y_true.astype(jnp.float32).mean()

    with pytest.raises(ValueError, match="batch_mean.*one value per sample"):
        _evaluate(MLP(), None, [batch_mean], x, y)
