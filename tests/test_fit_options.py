"""Keras' fit options: class_weight scales each training sample's loss, validation_freq
validates some epochs only (History holds val_* for those), and a Trainer subclass that
overrides compute_loss changes the loss and nothing else."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import linen as nn

import easyfit as ef


def _model():
    return nn.Sequential([lambda x: x.reshape((x.shape[0], -1)), nn.Dense(10)])


@pytest.fixture(scope="module")
def data():
    (x, y), (xv, yv) = ef.datasets.sample()["train"], ef.datasets.sample()["val"]
    return ef.data.Arrays(x[:400], y[:400], scale=1 / 255), (xv[:100] / 255.0, yv[:100])


def _params(trainer):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(trainer.params)]


def test_validation_freq_validates_the_epochs_asked(data):
    train, val = data
    trainer = ef.Trainer(_model(), optimizer=optax.sgd(0.1))
    history = trainer.fit(train, epochs=4, batch_size=100, validation_data=val, verbose=0, validation_freq=2)
    assert len(history.history["loss"]) == 4 and len(history.history["val_loss"]) == 2
    history = trainer.fit(
        train, epochs=3, batch_size=100, validation_data=val, verbose=0, validation_freq=[1, 3]
    )
    assert len(history.history["val_accuracy"]) == 2
    with pytest.raises(ValueError, match="validation_freq=0"):
        trainer.fit(train, epochs=1, validation_data=val, validation_freq=0, verbose=0)


def test_class_weight_scales_each_sample_loss(data):
    train, _ = data
    plain = ef.Trainer(_model(), optimizer=optax.sgd(0.1), seed=0)
    p = plain.fit(train, epochs=1, batch_size=100, verbose=0).history["loss"][0]
    ones = ef.Trainer(_model(), optimizer=optax.sgd(0.1), seed=0)
    ones.fit(train, epochs=1, batch_size=100, verbose=0, class_weight={c: 1.0 for c in range(10)})
    for a, b in zip(_params(plain), _params(ones), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # weight 1: the same training
    doubled = ef.Trainer(_model(), optimizer=optax.sgd(0.05), seed=0)
    d = doubled.fit(
        train, epochs=1, batch_size=100, verbose=0, class_weight={c: 2.0 for c in range(10)}
    ).history["loss"][0]
    assert d == pytest.approx(2 * p, rel=1e-5)  # twice the loss: half the rate, same steps
    for a, b in zip(_params(plain), _params(doubled), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    only_zero = ef.Trainer(_model(), optimizer=optax.sgd(0.1), seed=0)
    only_zero.fit(
        train, epochs=2, batch_size=100, verbose=0, class_weight={0: 1.0, **{c: 0.0 for c in range(1, 10)}}
    )
    x = train.x[:200].astype(np.float32) / 255
    assert (only_zero.predict(x).argmax(-1) == 0).mean() > 0.9  # it learnt class 0 alone
    with pytest.raises(ValueError, match="class_weight: key -1"):
        only_zero.fit(train, epochs=1, verbose=0, class_weight={-1: 1.0})


class SquaredLogits(ef.Trainer):
    """A custom loss through compute_loss: cross-entropy plus a penalty on large logits."""

    def compute_loss(self, outputs, batch):
        ce = optax.softmax_cross_entropy_with_integer_labels(outputs, batch["y"])
        return ce + 0.1 * (outputs**2).mean(axis=-1)


def test_compute_loss_override_changes_the_loss_and_nothing_else(data):
    train, val = data
    base = ef.Trainer(_model(), optimizer=optax.sgd(0.1), seed=0)
    custom = SquaredLogits(_model(), optimizer=optax.sgd(0.1), seed=0)
    hb = base.fit(train, epochs=2, batch_size=100, validation_data=val, verbose=0).history
    hc = custom.fit(train, epochs=2, batch_size=100, validation_data=val, verbose=0).history
    assert sorted(hb) == sorted(hc)  # same metrics, accuracy included
    assert hc["loss"][0] > hb["loss"][0]  # the penalty is in the loss
    logits = custom.predict(val[0])
    expected = (
        optax.softmax_cross_entropy_with_integer_labels(logits, val[1]) + 0.1 * (logits**2).mean(-1)
    ).mean()
    assert custom.evaluate(*val, batch_size=100)["loss"] == pytest.approx(float(expected), rel=1e-5)
