"""Trainer(gradient_accumulation_steps=k): k batches of b rows make one optimizer update, the
same as one batch of k*b rows; batches are what fit counts; a resume mid-accumulation is exact."""

from __future__ import annotations

import json

import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.callbacks import BackupAndRestore, LambdaCallback
from tests.helpers import Crash, crash_before, flat_params, run_python, untrained
from tests.helpers.models import TinyMLP as Tiny

#: k batches of b against one of k*b: the same sums in another order (float32), over a few
#: updates; Adam divides by the root of tiny second moments, so it gets the looser bound.
TOLERANCE = {"sgd": (1e-5, 1e-6), "adam": (1e-4, 1e-5)}
OPTIMIZERS = {
    "sgd": lambda: optax.sgd(0.1, momentum=0.9),
    "adam": lambda: optax.adam(1e-3),
    "plain": lambda: optax.sgd(0.1),  # no momentum: an update is -0.1 * the gradient
}
N = 96  # divides by every batch size below: no epoch ends on a short (padded) batch


@pytest.fixture(scope="module")
def arrays(mnist_arrays):
    x, y = mnist_arrays["train"]
    return (x[:N] / 255).astype(np.float32), y[:N]


def _trainer(k=None, optimizer="sgd", steps_per_execution=1):
    return ef.Trainer(
        Tiny(),
        optimizer=OPTIMIZERS[optimizer](),
        seed=0,
        gradient_accumulation_steps=k,
        steps_per_execution=steps_per_execution,
    )


def _fit(
    x, y, batch_size, k=None, *, optimizer="sgd", epochs=2, steps_per_execution=1, trainer=None, **fit_kwargs
):
    trainer = untrained(trainer) if trainer is not None else _trainer(k, optimizer, steps_per_execution)
    trainer.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0, **fit_kwargs)
    return trainer


@pytest.mark.parametrize("optimizer, steps_per_execution", [("sgd", 3), ("adam", 1)])
def test_k_batches_of_b_give_the_parameters_of_one_batch_of_kb(arrays, optimizer, steps_per_execution):
    # with and without sample_weight (each trainer fits twice, its compiled steps kept); with
    # SGD 3 batches per dispatch (3, 3, 2 an epoch): accumulations span dispatches
    x, y = arrays
    rtol, atol = TOLERANCE[optimizer]
    big = _fit(x, y, 48, optimizer=optimizer)  # 2 updates an epoch
    small = _fit(x, y, 12, 4, optimizer=optimizer, steps_per_execution=steps_per_execution)
    unweighted = flat_params(small.params)
    np.testing.assert_allclose(unweighted, flat_params(big.params), rtol=rtol, atol=atol)
    weights = {"sample_weight": np.linspace(0.0, 2.0, N).astype(np.float32)}
    _fit(x, y, 48, trainer=big, **weights)
    _fit(x, y, 12, trainer=small, **weights)
    np.testing.assert_allclose(flat_params(small.params), flat_params(big.params), rtol=rtol, atol=atol)
    assert not np.allclose(flat_params(small.params), unweighted, rtol=1e-3, atol=1e-4)  # weights count


def test_a_short_last_batch_weighs_as_much_as_a_full_one(arrays):
    # 30 rows in batches of 20: the second batch has 10 rows (and 10 padding rows, which count
    # zero). With k=2 the update is the mean of the two batches' mean-loss gradients, as Keras
    # averages the k gradients; for plain SGD from the same start, the mean of the parameters
    # each batch alone would give.
    x, y = arrays
    first = _fit(x[:20], y[:20], 20, optimizer="plain", epochs=1)
    second = _fit(x[20:30], y[20:30], 10, epochs=1, trainer=_trainer(optimizer="plain"))
    both = _fit(x[:30], y[:30], 20, 2, optimizer="plain", epochs=1)
    expected = (flat_params(first.params) + flat_params(second.params)) / 2
    np.testing.assert_allclose(flat_params(both.params), expected, rtol=1e-5, atol=1e-6)


def test_fit_counts_batches_and_the_optimizer_counts_updates(arrays):
    # Keras' way: steps_per_epoch, the callbacks' batches and state.step count batches; the
    # optimizer (its iterations) counts updates, one every k batches.
    x, y = arrays
    batches = []
    trainer = _trainer(3)
    trainer.fit(
        x,
        y,
        batch_size=12,
        epochs=2,
        steps_per_epoch=5,  # 10 batches in all: 3 updates, the 10th batch accumulated
        shuffle=False,
        verbose=0,
        callbacks=[LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b))],
    )
    assert batches == [0, 1, 2, 3, 4] * 2
    assert int(trainer.state.step) == 10
    assert int(trainer.state.opt_state.gradient_step) == 3
    assert int(trainer.state.opt_state.mini_step) == 1


def test_a_resume_mid_accumulation_is_bit_exact(arrays, tmp_path):
    # 8 batches an epoch, k=3: the backups after each batch of epoch 1 (its batch 1 leaves
    # one gradient accumulated, batch 2 two) hold the accumulator in the optimizer state; the
    # crash comes as batch 3 begins, after the 11th batch, two batches into an accumulation.
    x, y = arrays
    backup = tmp_path / "backup"
    reference = _fit(x, y, 12, 3, optimizer="adam")
    crashing = _trainer(3, "adam")
    with pytest.raises(Crash):
        crashing.fit(
            x,
            y,
            batch_size=12,
            epochs=2,
            shuffle=False,
            verbose=0,
            callbacks=[BackupAndRestore(backup, save_freq=1), crash_before(crashing, 1, 3)],
        )
    assert int(crashing.state.opt_state.mini_step) == 2  # 11 batches: 3 updates and 2 more
    point = BackupAndRestore(backup).restore_point()
    assert (point.epoch, point.batch) == (1, 3)
    resumed = _trainer(3, "adam")
    resumed.fit(
        x,
        y,
        batch_size=12,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[BackupAndRestore(backup, save_freq=1)],
    )
    assert np.array_equal(flat_params(resumed.params), flat_params(reference.params))
    assert int(resumed.state.opt_state.gradient_step) == 5  # 16 batches: 5 updates, 1 left


def test_bad_gradient_accumulation_steps_name_the_argument():
    for bad in (0, 1, 2.0, True, "2"):
        with pytest.raises(ValueError, match=r"gradient_accumulation_steps=.*integer >= 2"):
            ef.Trainer(Tiny(), gradient_accumulation_steps=bad)


_DEVICES = """
import json
import numpy as np, optax, easyfit as ef, jax
from tests.helpers import flat_params
from tests.helpers.models import TinyMLP as Tiny
x, y = ef.datasets.sample()["train"]
x, y = (x[:96] / 255).astype(np.float32), y[:96]
runs = {}
for name, n, k, batch_size in (("many", 4, 4, 12), ("one", 1, None, 48)):
    devices = jax.devices()[:n]  # a mesh of the first n of the process's devices
    t = ef.Trainer(Tiny(), optimizer=optax.adam(1e-3), seed=0, gradient_accumulation_steps=k, devices=devices)
    t.fit(x, y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
    runs[name] = {"devices": len(t.state.step.sharding.device_set), "params": flat_params(t.params).tolist()}
print(json.dumps(runs))
"""


@pytest.mark.slow
def test_accumulation_on_four_devices_matches_one_big_batch_on_one(tmp_path):
    runs = json.loads(run_python("-c", _DEVICES, devices=4).splitlines()[-1])
    many, one = runs["many"], runs["one"]
    assert many["devices"] == 4 and one["devices"] == 1
    rtol, atol = TOLERANCE["adam"]
    np.testing.assert_allclose(np.array(many["params"]), np.array(one["params"]), rtol=rtol, atol=atol)
