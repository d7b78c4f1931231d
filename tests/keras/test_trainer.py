"""fit, evaluate and predict as Keras 3's keras/src/trainers/trainer_test.py pins them down, on
arrays (Keras' ``ExampleModel``: a Dense layer without bias whose kernel is all ones) and the
MNIST sample.

Where easyfit differs on purpose (docs/keras.md, "fit, evaluate and predict"), the test asserts
easyfit's documented behaviour and says so: ``evaluate`` returns a dict by default,
``validation_split`` holds out a seeded random share, and ``steps_per_epoch`` past the data goes
on into the next pass.

Skipped, and why:

* ``test_metric_tracking``, ``test_nested_trainer_metrics*``, ``test_multiple_compiles``,
  ``test_recompile``, ``test_symbolic_build``, ``test_compile_eager_vs_jit_torch``,
  ``test_jit_compile_with_tf_determinism``, ``test_retracing*``,
  ``test_fit_eval_flow_for_jax_model_weights``, ``test_jit_fit_with_out_shardings_logic``:
  Keras' metric variables, ``compile``, eager and graph modes and backends; easyfit has no
  ``compile`` and always runs one jitted JAX step.
* ``test_fit_with_data_adapter``, ``test_*_sparse``, ``test_trainer_with_raggeds``,
  ``test_predict_preserve_order``, ``test_predict_generator``,
  ``test_steps_per_execution_steps_count_unknown_dataset_size``,
  ``test_steps_per_execution_steps_per_epoch_unknown_data_size``,
  ``test_validation_data_infinite_generator`` (its ``validation_steps`` is ported below on
  arrays): PyDataset, tf.data, torch and grain loaders, generators, sparse and ragged tensors;
  easyfit reads arrays, folders and record files through DALI (tests/data/).
* ``test_fit_with_custom_train_step``, ``test_evaluate_with_custom_test_step``,
  ``test_*compute_loss*``, ``test_metric_update_in_compute_loss``, ``test_internal_only_loss``:
  Keras' ``train_step(data)``, ``test_step`` and ``compute_loss(x, y, y_pred, sample_weight)``;
  easyfit's hooks are its own (docs/models.md; tests/test_fit_options.py, tests/test_models.py).
* ``test_steps_per_execution_*``: tests/test_steps.py and tests/test_steps_per_epoch.py.
* ``test_max_epochs_and_steps``: Keras' global ``config.set_max_epochs``; easyfit has none.
* ``test_adds_loss_scaling_optimizer``, ``test_loss_scaling_prevents_underflow``:
  tests/test_precision.py (float16 with dynamic loss scaling).
* ``test_on_batch_methods*``: ``train_on_batch``, ``test_on_batch``, ``predict_on_batch``;
  easyfit has no per-batch methods.
* ``test_training_arg``, ``test_functional_layer_training_overrides_model_training_argument``,
  ``test_constraints_are_applied``, ``test_rng_updated_during_predict``: Keras layers;
  easyfit's train flag and dropout are tested in tests/test_models.py.
* ``test_callback_methods_keys``, ``test_callbacks_can_update_state_at_batch_boundary``,
  ``test_stop_loop``: callbacks (tests/callbacks/ and the callbacks' Keras port).
* ``test_loss_weights``, ``test_partial_loss_partial_label``, ``test_nested_inputs``,
  ``test_nested_input_predict``: several inputs and outputs (tests/test_structured.py).
* ``test_evaluate_fixed_batch_dim_graph_matches_eager``, ``test_for_eval_epoch_iterator``:
  tf.data and Keras' epoch iterator.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import linen as nn

import easyfit as ef
from easyfit.callbacks import Callback


class Example(nn.Module):
    """Keras' ExampleModel: Dense(units), no bias, kernel all ones."""

    units: int = 3

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.units, use_bias=False, kernel_init=nn.initializers.ones)(x)


class Struct(nn.Module):
    """Keras' StructModel: a dict of inputs to a dict of outputs."""

    units: int = 3

    @nn.compact
    def __call__(self, x):
        ones = nn.initializers.ones
        return {
            "y_one": nn.Dense(self.units, use_bias=False, kernel_init=ones)(x["x_one"]),
            "y_two": nn.Dense(self.units, use_bias=False, kernel_init=ones)(x["x_two"]),
        }


class Counter(Callback):
    """Records the hooks' calls: test batches, epochs begun, and which epochs' logs validate."""

    def __init__(self):
        super().__init__()
        self.test_batches = 0
        self.epochs: list[int] = []
        self.validated: list[int] = []

    def on_test_batch_end(self, batch, logs=None):
        self.test_batches += 1

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)

    def on_epoch_end(self, epoch, logs=None):
        if "val_loss" in (logs or {}):
            self.validated.append(epoch)


def _example(units=3, optimizer="sgd", metrics=("mse",)):
    model = Example(units)
    return ef.Trainer(model, optimizer=optimizer, loss="mse", metrics=list(metrics), steps_per_execution=1)


ONES, ZEROS = np.ones((100, 4), np.float32), np.zeros((100, 3), np.float32)


def test_fit_flow():
    # Keras: test_fit_flow: one value per epoch in History, for the loss and each metric, as
    # Keras' SGD (learning rate 0.01) lowers the mse from 16
    trainer = _example()
    history = trainer.fit(ONES, ZEROS, batch_size=20, epochs=3, verbose=0).history
    assert len(history["loss"]) == len(history["mse"]) == 3
    np.testing.assert_allclose(history["mse"], [14.5, 11.5, 8.5], atol=1.0)  # Keras' tolerance
    np.testing.assert_allclose(history["loss"], history["mse"], rtol=1e-6)


def test_steps_per_epoch_past_the_data_goes_on_into_the_next_pass():
    # Keras: test_steps_per_epoch "not_match_but_high_enough". Keras' array adapter ends an
    # epoch when the data runs out (10 batches of the 11 asked); easyfit, on purpose, repeats
    # the data as Keras does for a repeating dataset: every epoch trains 11 batches.
    counted = []
    trainer = _example(units=1, optimizer=optax.sgd(0.0))
    x, y = np.ones((80, 4), np.float32), np.ones((80, 1), np.float32)

    class Steps(Callback):
        def on_train_batch_end(self, batch, logs=None):
            counted.append(batch)

    trainer.fit(x, y, batch_size=8, epochs=2, steps_per_epoch=11, callbacks=[Steps()], verbose=0)
    assert counted == list(range(11)) * 2


def test_fit_with_val_split():
    # Keras: test_fit_with_val_split: val_loss in History. Keras holds out the last 20%;
    # easyfit, on purpose, a seeded random 20% (docs/data.md): labels 1 on the last 20% only
    # give a val_loss (of a model that outputs 0) between 0 and 1, not 1.
    x = np.zeros((100, 4), np.float32)
    y = np.zeros((100, 1), np.float32)
    y[80:] = 1.0
    trainer = ef.Trainer(Example(1), optimizer=optax.sgd(0.0), loss="mse", metrics=[])
    history = trainer.fit(x, y, batch_size=20, epochs=1, validation_split=0.2, verbose=0).history
    assert "loss" in history and "val_loss" in history
    assert 0.0 < history["val_loss"][0] < 1.0
    again = ef.Trainer(Example(1), optimizer=optax.sgd(0.0), loss="mse", metrics=[])
    repeat = again.fit(x, y, batch_size=20, epochs=1, validation_split=0.2, verbose=0).history
    assert repeat["val_loss"] == history["val_loss"]  # the same samples: seeded


def test_evaluate_flow():
    # Keras: test_evaluate_flow: [loss, mse] = [16, 16] in Keras' form (return_dict=False), a
    # dict with return_dict=True. easyfit's default is the dict, on purpose (docs/keras.md).
    trainer = _example()
    assert trainer.evaluate(ONES, ZEROS, batch_size=16, return_dict=False) == pytest.approx([16.0, 16.0])
    output = trainer.evaluate(ONES, ZEROS, batch_size=16)
    assert isinstance(output, dict) and output == pytest.approx({"loss": 16.0, "mse": 16.0})


def test_evaluate_return_list_respect_metrics_order():
    # Keras: test_evaluate_return_list_respect_metrics_order (per-sample values: easyfit asks
    # for one value per sample, tests/keras/test_loss_and_metric_functions.py)
    def metrics_zero(y_true, y_pred):
        return np.float32(0.0) * y_pred[:, 0]

    def metrics_one(y_true, y_pred):
        return np.float32(0.0) * y_pred[:, 0] + 1.0

    x, y = np.ones((3, 2), np.float32), np.ones((3, 3), np.float32)
    out = _example(metrics=[metrics_zero, metrics_one]).evaluate(x, y, return_dict=False)
    assert len(out) == 3 and out[1:] == [0.0, 1.0]
    out = _example(metrics=[metrics_one, metrics_zero]).evaluate(x, y, return_dict=False)
    assert len(out) == 3 and out[1:] == [1.0, 0.0]


def test_predict_flow():
    # Keras: test_predict_flow
    outputs = _example().predict(ONES, batch_size=16)
    np.testing.assert_array_equal(outputs, 4 * np.ones((100, 3)))


def test_predict_flow_struct():
    # Keras: test_predict_flow_struct: a dict of inputs gives a dict of outputs
    trainer = ef.Trainer(Struct(), loss="mse", metrics=[])
    outputs = trainer.predict({"x_one": ONES, "x_two": ONES}, batch_size=16)
    assert isinstance(outputs, dict) and sorted(outputs) == ["y_one", "y_two"]
    for name in ("y_one", "y_two"):
        np.testing.assert_array_equal(outputs[name], 4 * np.ones((100, 3)))


def test_fit_with_different_batch_size_same_loss():
    # Keras: test_fit_with_different_batch_size_same_loss (a frozen model: the padding rows of a
    # batch of 80 over 100 samples do not count)
    x = np.random.default_rng(0).random((100, 4)).astype(np.float32)
    y = np.ones((100, 1), np.float32)
    losses = [
        _example(units=1, optimizer=optax.sgd(0.0)).fit(x, y, batch_size=b, verbose=0).history["loss"]
        for b in (80, 100)
    ]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)


def test_evaluate_with_different_batch_size_same_loss():
    # Keras: test_evaluate_with_different_batch_size_same_loss
    x = np.random.default_rng(0).random((100, 4)).astype(np.float32)
    y = np.ones((100, 1), np.float32)
    trainer = _example(units=1)
    a, b = (trainer.evaluate(x, y, batch_size=n)["loss"] for n in (80, 100))
    assert a == pytest.approx(b, rel=1e-6)


# ------------------------------------------------------------------ validation_steps and steps
@pytest.fixture(scope="module")
def mnist():
    (x, y), (xv, yv) = ef.datasets.sample()["train"], ef.datasets.sample()["val"]
    return x[:200].astype(np.float32) / 255, y[:200], xv[:100].astype(np.float32) / 255, yv[:100]


class Flat(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(x.reshape((x.shape[0], -1)))


def test_validation_steps(mnist):
    # Keras: test_validation_data_infinite_generator (validation_steps=4: four validation
    # batches per validation), and fit's docstring: each validation starts from the beginning
    # of the validation data, so that the same samples are used every time.
    x, y, xv, yv = mnist
    counter = Counter()
    trainer = ef.Trainer(Flat(), optimizer=optax.adam(1e-2), steps_per_execution=1, seed=0)
    history = trainer.fit(
        x, y, batch_size=10, epochs=2, validation_data=(xv, yv), validation_steps=4, callbacks=[counter],
        verbose=0,
    ).history  # fmt: skip
    assert counter.test_batches == 2 * 4
    expected = trainer.evaluate(xv[:40], yv[:40], batch_size=10)
    assert history["val_loss"][-1] == pytest.approx(expected["loss"], rel=1e-5)
    assert history["val_accuracy"][-1] == pytest.approx(expected["accuracy"], abs=1e-6)


def test_evaluate_steps(mnist):
    # Keras: Trainer.evaluate's steps ("total number of steps (batches of samples) to draw
    # before declaring the evaluation round finished"); past the data, every sample once.
    x, y, xv, yv = mnist
    trainer = ef.Trainer(Flat(), seed=0)
    counter = Counter()
    some = trainer.evaluate(xv, yv, batch_size=16, steps=3, callbacks=[counter])
    assert counter.test_batches == 3
    assert some == pytest.approx(trainer.evaluate(xv[:48], yv[:48], batch_size=16), rel=1e-5)
    assert trainer.evaluate(xv, yv, batch_size=16, steps=50) == pytest.approx(
        trainer.evaluate(xv, yv, batch_size=16), rel=1e-6
    )
    with pytest.raises(ValueError, match="steps=0"):
        trainer.evaluate(xv, yv, steps=0)


def test_predict_steps(mnist):
    # Keras: Trainer.predict's steps: the outputs of that many batches
    x, _, xv, _ = mnist
    trainer = ef.Trainer(Flat(), seed=0)
    outputs = trainer.predict(xv, batch_size=16, steps=2)
    np.testing.assert_allclose(outputs, trainer.predict(xv, batch_size=16)[:32], rtol=1e-6)


# -------------------------------------------------------------- validation_freq, initial_epoch
def test_validation_freq_int_counts_from_initial_epoch(mnist):
    # Keras: Trainer._should_eval: epoch + 1 (the absolute epoch, initial_epoch included)
    # divisible by validation_freq
    x, y, xv, yv = mnist
    counter = Counter()
    trainer = ef.Trainer(Flat(), optimizer=optax.sgd(0.0))
    trainer.fit(
        x, y, batch_size=100, epochs=5, initial_epoch=1, validation_data=(xv, yv), validation_freq=2,
        callbacks=[counter], verbose=0,
    )  # fmt: skip
    assert counter.epochs == [1, 2, 3, 4] and counter.validated == [1, 3]


def test_validation_freq_list(mnist):
    # Keras: Trainer._should_eval: the (1-based) epochs listed
    x, y, xv, yv = mnist
    counter = Counter()
    trainer = ef.Trainer(Flat(), optimizer=optax.sgd(0.0))
    history = trainer.fit(
        x, y, batch_size=100, epochs=4, validation_data=(xv, yv), validation_freq=[1, 4], callbacks=[counter],
        verbose=0,
    )  # fmt: skip
    assert counter.validated == [0, 3] and len(history.history["val_loss"]) == 2


@pytest.mark.parametrize("freq", ["2", 0, 1.5])
def test_validation_freq_of_another_kind_is_refused(mnist, freq):
    # Keras: Trainer._should_eval raises ValueError for what is neither an int nor a list
    x, y, xv, yv = mnist
    with pytest.raises(ValueError, match=rf"validation_freq={freq!r}"):
        ef.Trainer(Flat()).fit(x, y, validation_data=(xv, yv), validation_freq=freq, verbose=0)


def test_initial_epoch(mnist):
    # Keras: fit's initial_epoch: epochs run from initial_epoch to epochs - 1, and History and
    # the callbacks see their absolute indices; epochs <= initial_epoch trains nothing.
    x, y, _, _ = mnist
    counter = Counter()
    trainer = ef.Trainer(Flat(), optimizer=optax.sgd(0.1))
    history = trainer.fit(x, y, batch_size=100, epochs=3, initial_epoch=1, callbacks=[counter], verbose=0)
    assert counter.epochs == [1, 2] and history.epoch == [1, 2] and len(history.history["loss"]) == 2
    before = [np.asarray(a) for a in jax.tree_util.tree_leaves(trainer.params)]
    nothing = trainer.fit(x, y, batch_size=100, epochs=2, initial_epoch=2, verbose=0)
    assert nothing.epoch == [] and nothing.history == {}
    after = [np.asarray(a) for a in jax.tree_util.tree_leaves(trainer.params)]
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------ sample_weight
def test_sample_weight_of_ones_is_no_weight(mnist):
    # Keras: test_metric_tracking (fit with sample_weight=np.ones): the same training as none
    x, y, _, _ = mnist
    plain = ef.Trainer(Flat(), optimizer=optax.sgd(0.1), seed=0)
    plain.fit(x, y, batch_size=50, verbose=0)
    ones = ef.Trainer(Flat(), optimizer=optax.sgd(0.1), seed=0)
    ones.fit(x, y, batch_size=50, verbose=0, sample_weight=np.ones(len(x)))
    leaves = jax.tree_util.tree_leaves
    for a, b in zip(leaves(plain.params), leaves(ones.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_sample_weight_zero_still_counts_as_a_row(mnist):
    # Keras: the "sum_over_batch_size" reduction: sum(weight * loss) / rows, so a sample of weight
    # 0 adds nothing to the sum but still counts in the rows
    x, y, _, _ = mnist
    w = np.where(np.arange(len(x)) % 4 == 0, 0.0, 2.0)
    trainer = ef.Trainer(Flat(), optimizer=optax.sgd(0.0), seed=0)
    weighted = trainer.evaluate(x, y, batch_size=50, sample_weight=w)["loss"]
    logits = trainer.predict(x, batch_size=50).astype(np.float64)
    z = logits - logits.max(-1, keepdims=True)
    per_sample = -(z - np.log(np.exp(z).sum(-1, keepdims=True)))[np.arange(len(y)), y]
    assert weighted == pytest.approx((w * per_sample).sum() / len(x), rel=1e-5)


def test_sample_weight_in_validation_data(mnist):
    # Keras: validation_data=(x_val, y_val, val_sample_weights)
    x, y, xv, yv = mnist
    wv = np.where(yv == 3, 5.0, 1.0)
    trainer = ef.Trainer(Flat(), optimizer=optax.sgd(0.0), seed=0)
    history = trainer.fit(x, y, batch_size=50, validation_data=(xv, yv, wv), verbose=0).history
    weighted = trainer.evaluate(xv, yv, sample_weight=wv)["loss"]
    assert history["val_loss"][0] == pytest.approx(weighted, rel=1e-5)
    assert history["val_loss"][0] != pytest.approx(trainer.evaluate(xv, yv)["loss"], rel=1e-3)


def test_sample_weight_is_split_with_validation_split():
    # Keras: Trainer.fit splits sample_weight with x and y (train_validation_split): the held-out
    # samples keep their weights in val_loss (a model that outputs 0 on labels 1: loss = weight)
    x, y = np.zeros((100, 4), np.float32), np.ones((100, 1), np.float32)
    trainer = ef.Trainer(Example(1), optimizer=optax.sgd(0.0), loss="mse", metrics=[])
    w = np.full(100, 3.0)
    history = trainer.fit(x, y, batch_size=20, validation_split=0.2, sample_weight=w, verbose=0).history
    assert history["loss"] == pytest.approx([3.0]) and history["val_loss"] == pytest.approx([3.0])


@pytest.mark.parametrize("bad", [np.ones(7), -np.ones(200), np.ones((200, 2))])
def test_sample_weight_that_is_not_one_weight_per_sample_is_refused(mnist, bad):
    # Keras: Trainer.fit's sample_weight (one weight per sample, as many as x); easyfit refuses
    # other shapes and negative weights, naming sample_weight (temporal weights of shape
    # (samples, steps) are not supported: override compute_loss to weigh within a sample)
    x, y, _, _ = mnist
    with pytest.raises(ValueError, match="sample_weight"):
        ef.Trainer(Flat()).fit(x, y, sample_weight=bad, verbose=0)
