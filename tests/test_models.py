"""NNX models that update their own state in training (BatchNorm, Dropout) train through fit; a
dict of inputs without the key a model reads is named, linen or NNX."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

import easyfit as ef


class NormedMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(784, 64, rngs=rngs)
        self.norm = nnx.BatchNorm(64, momentum=0.9, rngs=rngs)
        self.dropout = nnx.Dropout(0.2, rngs=rngs)
        self.out = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x):
        x = self.norm(self.hidden(x.reshape((x.shape[0], -1))))
        return self.out(self.dropout(nnx.relu(x)))


def test_batch_norm_statistics_are_learned_and_used():
    (x, y), (xv, yv) = ef.datasets.sample()["train"], ef.datasets.sample()["val"]
    trainer = ef.Trainer(NormedMLP(nnx.Rngs(0)), optimizer=optax.adam(1e-3))
    history = trainer.fit(
        ef.data.Arrays(x[:2000], y[:2000], scale=1 / 255),
        epochs=2,
        batch_size=100,
        validation_data=ef.data.Arrays(xv, yv, scale=1 / 255),
        verbose=0,
    )
    assert history.history["val_accuracy"][-1] > 0.8
    model = trainer.model
    assert not np.allclose(np.asarray(model.norm.mean[...]), 0.0)  # statistics were updated
    model.eval()
    direct = model(xv[:100].astype(np.float32) / 255)
    predicted = trainer.predict(ef.data.Arrays(xv[:100], yv[:100], scale=1 / 255))
    np.testing.assert_allclose(predicted, np.asarray(jax.device_get(direct)), rtol=1e-4, atol=1e-4)


class ReadsImage(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(2)(x["image"].reshape((x["image"].shape[0], -1)))


class NNXReadsImage(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.out = nnx.Linear(9, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(x["image"].reshape((x["image"].shape[0], -1)))


def test_a_dict_of_inputs_without_the_key_the_model_reads_names_the_keys_given():
    x, y = {"imgae": np.zeros((4, 3, 3), np.float32), "extra": np.zeros((4, 2))}, np.zeros(4, np.int32)
    said = r"^x: the model asked for the input 'image' \(KeyError\), but .* keys \['extra', 'imgae'\]"
    for model in (ReadsImage(), NNXReadsImage(nnx.Rngs(0))):  # first traced in init, in a step
        with ef.Trainer(model) as t:
            with pytest.raises(ef.errors.DataError, match=said) as raised:
                t.fit(x, y, batch_size=2, verbose=0)
            assert isinstance(raised.value.__cause__, KeyError)  # the model's own, chained
            with pytest.raises(ef.errors.DataError, match=said):
                t.predict(x, batch_size=2, verbose=0)
