"""Keras' ``class_weight``, as pinned down by ``TestClassWeightToSampleWeights`` in
keras/src/trainers/data_adapters/data_adapter_utils_test.py (and the array and dataset adapters
that use it): each training sample's loss is multiplied by the weight of its class, a class with
no key weighs 1.0, keys may be ints, numeric strings or integral floats (as JSON gives them), and
a key that names no class is refused, naming it.

How the weights are observed: a model whose outputs are all zero and an optimizer that does not
move it, so every sample's cross-entropy is ``ln(classes)`` and the training loss of an epoch
(Keras' reduction: the mean over the rows of ``weight * loss``) is ``ln(classes)`` times the mean
of the samples' weights; evaluation (no class weights) gives ``ln(classes)``.

Skipped, and why:

* ``test_class_weight_to_sample_weights_{torch,jax,tf}_specific``: backend tensor types; easyfit
  has one backend, and its labels reach the weights as JAX arrays in every case above.
* ``DistributedBatchSampler``, ``TestMultiWorkerValidation``, ``TestDataAdapterFactory``: torch
  samplers, Keras' multi-worker auto-sharding and generator adapters, which easyfit does not have
  (its sharding is tested in tests/test_parallel.py and tests/test_distributed.py).
* Keras refuses ``class_weight`` together with ``sample_weight``; easyfit multiplies them
  (documented in ``Trainer.fit`` and docs/keras.md; tested in tests/test_structured.py).
"""

from __future__ import annotations

import math

import numpy as np
import optax
import pytest
from flax import linen as nn

import easyfit as ef


class Zeros(nn.Module):
    """Outputs 0 for every class whatever the input: each sample's cross-entropy is ln(classes)."""

    classes: int

    @nn.compact
    def __call__(self, x):
        dense = nn.Dense(self.classes, kernel_init=nn.initializers.zeros, bias_init=nn.initializers.zeros)
        return dense(x.reshape((x.shape[0], -1)))


def _train_loss(y, class_weight, classes, loss=None):
    """The training loss of one epoch (one batch) over labels ``y`` with ``class_weight``."""
    x = np.ones((len(y), 2), np.float32)
    trainer = ef.Trainer(Zeros(classes), optimizer=optax.sgd(0.0), loss=loss, metrics=[])
    return trainer.fit(x, y, batch_size=len(y), verbose=0, class_weight=class_weight).history["loss"][0]


def _mean_weight(y, class_weight, classes, loss=None):
    return _train_loss(y, class_weight, classes, loss) / math.log(classes)


def test_simple_class_labels():
    # Keras: TestClassWeightToSampleWeights "simple_class_labels"
    y = np.array([0, 1, 0, 2], np.int32)
    assert _mean_weight(y, {0: 1.0, 1: 2.0, 2: 3.0}, 3) == pytest.approx(np.mean([1, 2, 1, 3]), rel=1e-5)


def test_unmapped_class_weighs_one():
    # Keras: TestClassWeightToSampleWeights "unmapped_class": y=[0, 3, 0, 2] with
    # {0: 1, 1: 2, 2: 3} gives the weights [1, 1, 1, 3] (class 3 has no key).
    y = np.array([0, 3, 0, 2], np.int32)
    assert _mean_weight(y, {0: 1.0, 1: 2.0, 2: 3.0}, 4) == pytest.approx(np.mean([1, 1, 1, 3]), rel=1e-5)


def test_one_key_weighs_only_its_class():
    # Keras: TestClassWeightToSampleWeights "unmapped_class" (the case): {0: 0.1} on ten
    # classes weighs class 0 by 0.1 and the nine others by 1.0.
    y = np.arange(10, dtype=np.int32)
    assert _mean_weight(y, {0: 0.1}, 10) == pytest.approx((0.1 + 9) / 10, rel=1e-5)


def test_one_hot_encoded_labels():
    # Keras: TestClassWeightToSampleWeights "one_hot_encoded_labels": the class is the argmax,
    # for integer one-hot rows as for float ones.
    rows = np.array([[1, 0, 0], [0, 1, 0], [1, 0, 0], [0, 0, 1]])
    for y in (rows.astype(np.int32), rows.astype(np.float32)):
        got = _mean_weight(y, {0: 1.0, 1: 2.0, 2: 3.0}, 3, loss="categorical_crossentropy")
        assert got == pytest.approx(np.mean([1, 2, 1, 3]), rel=1e-5)


def test_multi_dimensional_input():
    # Keras: TestClassWeightToSampleWeights "multi_dimensional_input": labels of shape (n, 1)
    y = np.array([[0], [1], [0], [2]], np.int32)
    assert _mean_weight(y, {0: 1.0, 1: 2.0, 2: 3.0}, 3) == pytest.approx(np.mean([1, 2, 1, 3]), rel=1e-5)


def test_all_unmapped():
    # Keras: TestClassWeightToSampleWeights "all_unmapped": {} weighs every sample 1.0
    y = np.array([0, 1, 0, 2], np.int32)
    assert _mean_weight(y, {}, 3) == pytest.approx(1.0, rel=1e-5)


def test_string_number_keys():
    # Keras: TestClassWeightToSampleWeights "string_number_keys" (as json.load gives them)
    y = np.array([0, 1, 0, 2], np.int32)
    weights = {"0": 1.0, "1": 2.0, "2": 3.0}
    assert _mean_weight(y, weights, 3) == pytest.approx(np.mean([1, 2, 1, 3]), rel=1e-5)


def test_float_number_keys():
    # Keras: TestClassWeightToSampleWeights "float_number_keys"
    y = np.array([0, 1, 0, 2], np.int32)
    weights = {0.0: 1.0, 1.0: 2.0, 2.0: 3.0}
    assert _mean_weight(y, weights, 3) == pytest.approx(np.mean([1, 2, 1, 3]), rel=1e-5)


@pytest.mark.parametrize("key", ["invalid", None, 2.5, -1, "-1", True])
def test_invalid_key(key):
    # Keras: test_class_weight_to_sample_weights_invalid_key, ..._none_key. easyfit also refuses
    # keys that convert to an int but name no class (2.5, negatives, a bool), which Keras would
    # silently never match.
    y = np.array([0, 1, 0, 2], np.int32)
    with pytest.raises(ValueError, match=rf"class_weight: key {key!r}"):
        _train_loss(y, {key: 0.5}, 3)


def test_key_beyond_the_model_outputs():
    # Keras: TestClassWeightToSampleWeights (a key is a class index): a key past the model's
    # outputs names no class; easyfit says so before training rather than never using it.
    y = np.array([0, 1, 0, 2], np.int32)
    with pytest.raises(ValueError, match=r"class_weight: key '3' names no class.*3 classes"):
        _train_loss(y, {"3": 2.0}, 3)


def test_non_dict():
    # Keras: test_class_weight_to_sample_weights_non_dict
    y = np.array([0, 1, 0, 2], np.int32)
    with pytest.raises(ValueError, match="class_weight='not_a_dict'.*dict"):
        _train_loss(y, "not_a_dict", 3)


def test_binary_labels_are_rounded():
    # Keras: make_class_weight_map_fn in tf_dataset_adapter.py (labels with one column are
    # rounded to a class); one sigmoid output has the two classes 0 and 1.
    x = np.ones((4, 2), np.float32)
    y = np.array([[0.0], [1.0], [1.0], [1.0]], np.float32)
    trainer = ef.Trainer(Zeros(1), optimizer=optax.sgd(0.0), loss="binary_crossentropy", metrics=[])
    loss = trainer.fit(x, y, batch_size=4, verbose=0, class_weight={0: 1.0, 1: 3.0}).history["loss"][0]
    assert loss / math.log(2) == pytest.approx(np.mean([1, 3, 3, 3]), rel=1e-5)
    with pytest.raises(ValueError, match="class_weight: key 2 names no class"):
        trainer.fit(x, y, batch_size=4, verbose=0, class_weight={2: 1.0})


def test_class_weight_is_for_training_only():
    # Keras: Trainer.fit's class_weight ("during training only"): val_loss is unweighted.
    y = np.array([0, 1, 0, 2], np.int32)
    x = np.ones((4, 2), np.float32)
    trainer = ef.Trainer(Zeros(3), optimizer=optax.sgd(0.0), metrics=[])
    logs = trainer.fit(x, y, batch_size=4, verbose=0, class_weight={0: 5.0}, validation_data=(x, y)).history
    assert logs["loss"][0] == pytest.approx(math.log(3) * np.mean([5, 1, 5, 1]), rel=1e-5)
    assert logs["val_loss"][0] == pytest.approx(math.log(3), rel=1e-5)


def test_class_weight_on_an_image_folder(tmp_path):
    # Keras: test_fit_with_data_adapter "py_dataset_cw" (class_weight with a dataset, not arrays):
    # labels read by DALI from class folders, a string key as JSON gives it.
    root = ef.datasets.sample_folder(tmp_path / "mnist", limit=(200, 100))
    labels = ef.data.ImageFolder(root + "/train").labels
    trainer = ef.Trainer(Zeros(10), optimizer=optax.sgd(0.0), metrics=[])
    loss = trainer.fit(root, epochs=1, batch_size=50, verbose=0, class_weight={"3": 4.0}).history["loss"][0]
    expected = np.where(np.asarray(labels) == 3, 4.0, 1.0).mean()
    assert loss / math.log(10) == pytest.approx(expected, rel=1e-5)
