"""Inputs of a shape the model was not built for: a DataError naming both shapes, in fit,
evaluate and predict, before the model runs; a model that takes other sizes still does."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import linen as nn

import easyfit as ef


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3), strides=(2, 2))(x))
        return nn.Dense(10)(x.reshape((x.shape[0], -1)))


class PooledCNN(nn.Module):
    """Fully convolutional: global average pooling takes any image size."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Conv(4, (3, 3))(x)).mean(axis=(1, 2)))


def _trained(model) -> tuple[ef.Trainer, np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).random((40, 28, 28, 1)).astype(np.float32)
    y = np.arange(40) % 10
    trainer = ef.Trainer(model, optimizer="adam", seed=0)
    trainer.fit(x, y, batch_size=20, verbose=0)
    return trainer, x, y


@pytest.fixture(scope="module")
def cnn():
    return _trained(CNN())


def test_one_image_without_its_batch_axis_is_named(cnn):
    trainer, x, _ = cnn
    with pytest.raises(ef.errors.DataError) as info:
        trainer.predict(x[0])
    message = str(info.value)
    assert "built for samples of shape (28, 28, 1)" in message
    assert "received samples of shape (28, 1)" in message
    assert "a single image? add a batch axis" in message
    assert trainer.predict(x[:1]).shape == (1, 10)  # with the axis


@pytest.mark.parametrize("call", ["fit", "evaluate", "predict"])
def test_images_of_another_size_name_both_shapes(cnn, call):
    trainer, _, y = cnn
    before = jax.device_get(trainer.state.params)
    other = np.zeros((10, 32, 32, 3), np.float32)
    args = (other,) if call == "predict" else (other, y[:10])
    kwargs = {"verbose": 0} if call == "fit" else {}
    with pytest.raises(ef.errors.DataError, match=r"built for samples of shape \(28, 28, 1\)") as info:
        getattr(trainer, call)(*args, **kwargs)
    assert "received samples of shape (32, 32, 3)" in str(info.value)
    assert "add a batch axis" not in str(info.value)
    after = jax.device_get(trainer.state.params)
    for a, b in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after)):
        np.testing.assert_array_equal(a, b)  # nothing trained on them


def test_a_model_that_takes_other_sizes_still_gets_them():
    trainer, _, _ = _trained(PooledCNN())
    assert trainer.predict(np.zeros((3, 36, 36, 1), np.float32)).shape == (3, 10)
