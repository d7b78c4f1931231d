"""Structured batches (dicts and tuples of arrays in and out), per-output losses, loss weights
and metrics, sample weights, and a custom train_step: through fit, evaluate and predict on real
DALI pipelines, on one device in this process and on four in a fresh one. What easyfit logs is
compared elementwise with NumPy's computation from the model's outputs."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import linen as nn

import easyfit as ef
from easyfit.callbacks import BackupAndRestore
from easyfit.errors import DataError
from tests.helpers import Crash, crash_at, flat_params, last_json, run_program
from tests.helpers.structured import BATCH, N, TwoHeads, data, run_all, two_heads

#: float32 sums of 110 per-sample losses against NumPy's float64.
RTOL = 1e-5
#: parameters trained on 1 and 4 devices: float32 gradients summed in another order.
PARAMS_RTOL, PARAMS_ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def one_device():
    return run_all()


def check(r: dict) -> None:
    """Everything run_all measured, on however many devices it ran."""
    # Per-output losses: total = weighted sum, <out>_loss unweighted, metrics per output; the
    # second epoch (from the device cache) logs the same; validation and evaluate with weights.
    d = r["dict"]
    logs, want = d["logs"], d["expected"]
    assert sorted(logs) == sorted(
        ["loss", "kind_loss", "box_loss", "kind_accuracy", "box_mae"]
        + ["val_loss", "val_kind_loss", "val_box_loss", "val_kind_accuracy", "val_box_mae"]
    )
    for name, value in want.items():
        np.testing.assert_allclose(logs[name], [value, value], rtol=RTOL, err_msg=name)
        weighted = d["expected_weighted"][name]
        np.testing.assert_allclose(logs[f"val_{name}"], [weighted] * 2, rtol=RTOL, err_msg=name)
        np.testing.assert_allclose(d["evaluate"][name], weighted, rtol=RTOL, err_msg=name)
    assert d["predict_shapes"] == {"kind": [N, 3], "box": [N, 4]}
    # Tuples in and out: outputs named output_<i>.
    t = r["tuple"]
    names = {"loss": "loss", "output_0_loss": "kind_loss", "output_1_loss": "box_loss"}
    names |= {"output_0_accuracy": "kind_accuracy", "output_1_mae": "box_mae"}
    assert sorted(t["logs"]) == sorted(names)
    for got, want_name in names.items():
        np.testing.assert_allclose(t["logs"][got], [t["expected"][want_name]], rtol=RTOL, err_msg=got)
    assert r["trained"]["loss"][-1] < r["trained"]["loss"][0]
    # sample_weight times class_weight in training; sample_weight alone in validation and
    # evaluate; accuracy unweighted (Keras' metrics).
    w = r["weights"]
    np.testing.assert_allclose(w["logs"]["loss"], [w["expected_train"]], rtol=RTOL)
    np.testing.assert_allclose(w["logs"]["val_loss"], [w["expected_val"]], rtol=RTOL)
    np.testing.assert_allclose(w["evaluate"]["loss"], w["expected_val"], rtol=RTOL)
    np.testing.assert_allclose(w["logs"]["accuracy"], [w["expected_accuracy"]], rtol=RTOL)
    # A sample of weight zero: its inputs and labels change nothing.
    np.testing.assert_array_equal(r["zero_weights"]["same"], r["zero_weights"]["changed"])
    # The custom train_step: traced once per compiled chunk function (not run in Python per
    # step): chunks of 2 steps and each epoch's last one of 1; two updates per batch for 3 steps
    # x 2 epochs; the frozen layer kept, the other trained.
    assert r["two_updates"]["step"] == 12 and r["two_updates"]["traces"] == 2
    assert r["two_updates"]["logs"] == ["accuracy", "loss"]
    assert r["frozen"]["first_kept"] and r["frozen"]["last_moved"]
    assert r["frozen"]["logs"] == ["accuracy", "loss"]
    assert r["nnx"]["loss"][-1] < r["nnx"]["loss"][0] and r["nnx"]["predict"] == [N, 3]


def test_structured_batches_on_one_device(one_device):
    assert one_device["devices"] == 1
    check(one_device)


@pytest.mark.slow
def test_structured_batches_on_four_devices(one_device):
    four = last_json(run_program("structured_devices.py", devices=4))
    assert four["devices"] == 4
    check(four)
    # sharded leaf by leaf, shuffled with their sample: the same training as on one device
    np.testing.assert_allclose(
        four["trained"]["params"], one_device["trained"]["params"], rtol=PARAMS_RTOL, atol=PARAMS_ATOL
    )
    np.testing.assert_allclose(four["trained"]["loss"], one_device["trained"]["loss"], rtol=PARAMS_RTOL)


# ----------------------------------------------------------------------------- clear errors
def test_arguments_that_do_not_fit_are_named():
    d = data()
    x, y = d["x"], d["y"]
    with pytest.raises(DataError, match=r"x\['image'\] has 110 samples but x\['extra'\] has 109"):
        ef.data.Arrays({"image": x["image"], "extra": x["extra"][:-1]}, y)
    with pytest.raises(DataError, match=r"x\['image'\] has 110 samples but y\['box'\] has 100"):
        ef.data.Arrays(x, {"kind": y["kind"], "box": y["box"][:100]})
    with pytest.raises(DataError, match="sample_weight has 3 samples but x has 110"):
        ef.data.Arrays(x, y, sample_weight=[1.0, 2.0, 3.0])
    with pytest.raises(DataError, match=r"sample_weight\[1\]=-1.0"):
        ef.data.Arrays(x["extra"][:3], y["kind"][:3], sample_weight=[1.0, -1.0, 3.0])
    batches = [x["extra"][:40], x["extra"][40:80], x["extra"][80:]]  # a list of batches
    with pytest.raises(DataError, match=r"x: a list whose items differ in shape \(\(40, 3\) and \(30, 3\)\)"):
        ef.data.Arrays(batches, y["kind"])
    # through fit, the refusal of inputs that are not read by index says it too
    refused = r"x: a list of 3 arrays of different shapes .* dict or tuple of arrays"
    with pytest.raises(TypeError, match=refused):
        ef.Trainer(nn.Dense(3)).fit(batches, y["kind"], verbose=0)
    with pytest.raises(DataError, match="x has 2 samples but y has 110 .* pass a tuple or a dict"):
        ef.data.Arrays([x["extra"], x["extra"]], y["kind"])  # Keras' list of inputs
    with pytest.raises(DataError, match="y: key 'box size' is not a name"):
        ef.data.Arrays(x, {"box size": y["box"]})
    with pytest.raises(DataError, match=r"x\['image'\]: a dict inside a dict"):
        ef.data.Arrays({"image": {"a": x["image"]}}, y)
    with pytest.raises(ValueError, match="sample_weight: given with arrays only"):
        ef.Trainer(nn.Dense(3)).fit(ef.data.Arrays(x["extra"], y["kind"]), sample_weight=d["sample_weight"])


def test_losses_and_metrics_that_do_not_fit_the_outputs_are_named():
    d = data()
    x, y = d["x"], d["y"]

    def fit(**kwargs):
        with ef.Trainer(TwoHeads(), optimizer=optax.sgd(0.1), **kwargs) as t:
            return t.fit(x, y, batch_size=BATCH, verbose=0)

    with pytest.raises(ValueError, match=r"loss: 'size' is not an output; the outputs are \['kind', 'box'\]"):
        fit(loss={"kind": "sparse_categorical_crossentropy", "size": "mse"})
    with pytest.raises(ValueError, match="metrics=\\['accuracy'\\]: the model has several outputs"):
        fit(loss={"kind": "sparse_categorical_crossentropy", "box": "mse"}, metrics=["accuracy"])
    with pytest.raises(ValueError, match="loss_weights: 2 entries for 3 outputs"):
        ef.core.multi_output.loss_function("mse", [1.0, 2.0], (y["box"], y["box"], y["box"]))
    with pytest.raises(ValueError, match="a loss per output needs y as a dict"):
        with ef.Trainer(nn.Dense(3), loss={"kind": "mse"}) as t:
            t.fit(x["extra"], y["kind"], verbose=0)
    with pytest.raises(ValueError, match="class_weight: the model has several outputs"):
        with ef.Trainer(TwoHeads(), loss="mse") as t:
            t.fit(x, y, verbose=0, class_weight={0: 1.0})
    with pytest.raises(ValueError, match="the model returned a single array, but y is a dict"):
        with ef.Trainer(nn.Dense(3)) as t:
            t.fit(x["extra"], y, verbose=0)
    with pytest.raises(
        DataError, match=r"y\['kind'\]: label 7 \(at x\[0\]\) is outside the model's 3 outputs"
    ):
        with ef.Trainer(TwoHeads()) as t:
            t.fit(x, {"kind": np.full(N, 7), "box": y["box"]}, verbose=0)


def test_losses_inferred_per_output_and_predict_takes_a_tuple_of_inputs():
    d = data()
    x, y = d["x"], d["y"]
    with ef.Trainer(TwoHeads(tuples=True), optimizer=optax.sgd(0.1), seed=0) as t:
        history = t.fit((x["image"], x["extra"]), (y["kind"], y["box"]), batch_size=BATCH, verbose=0)
        assert t.loss == ["sparse_categorical_crossentropy", "mse"]
        assert sorted(history.history) == [
            "input_wait",
            "loss",
            "output_0_accuracy",
            "output_0_loss",
            "output_1_loss",
        ]
        kind, box = t.predict((x["image"], x["extra"]))  # a tuple of inputs, not (x, y)
        assert kind.shape == (N, 3) and box.shape == (N, 4)


def test_save_load_and_export_with_a_dict_of_inputs(tmp_path):
    d = data()
    x, y = d["x"], d["y"]
    with ef.Trainer(TwoHeads(), optimizer=optax.sgd(0.1), loss="mse", seed=0) as t:
        t.fit(
            x, {"kind": np.eye(3, dtype=np.float32)[y["kind"]], "box": y["box"]}, batch_size=BATCH, verbose=0
        )
        want = t.predict(x)
        t.save(tmp_path / "ckpt")
        path = t.export(tmp_path / "exported")
    with ef.Trainer(TwoHeads(), optimizer=optax.sgd(0.1), loss="mse") as fresh:
        fresh.load(tmp_path / "ckpt")  # no batch seen: the recorded dict of input shapes
        got = fresh.predict(x)
    fn, meta = ef.persistence.export.load_exported(path)
    served = fn({"image": x["image"][:7], "extra": x["extra"][:7]})
    assert meta["input_shape"] == {"image": [None, 4, 4, 1], "extra": [None, 3]}
    for k in ("kind", "box"):
        np.testing.assert_array_equal(got[k], want[k])
        np.testing.assert_allclose(np.asarray(served[k]), want[k][:7], rtol=1e-5, atol=1e-6)


def test_crash_then_resume_mid_epoch_is_exact(tmp_path):
    d = data()

    def run(trainer, callbacks=()):
        history = trainer.fit(
            d["x"],
            d["y"],
            sample_weight=d["sample_weight"],
            epochs=2,
            batch_size=BATCH,
            verbose=0,
            validation_data=(d["x"], d["y"]),
            callbacks=list(callbacks),
            cache=False,
        )
        return history.epoch, {k: v[-1] for k, v in history.history.items() if k != "input_wait"}

    reference = two_heads(optax.adam(1e-2))
    _, ref_logs = run(reference)
    crashing = two_heads(optax.adam(1e-2))
    with pytest.raises(Crash):
        run(crashing, [BackupAndRestore(tmp_path / "b", save_freq=1), crash_at(crashing, 1, 1)])
    resumed = two_heads(optax.adam(1e-2))
    epochs, logs = run(resumed, [BackupAndRestore(tmp_path / "b", save_freq=1)])
    assert epochs == [1] and int(resumed.state.step) == int(reference.state.step) == 6
    assert logs == ref_logs  # per-output losses and metrics included, not a timing
    np.testing.assert_array_equal(flat_params(resumed.params), flat_params(reference.params))
    np.testing.assert_array_equal(
        flat_params(resumed.state.opt_state), flat_params(reference.state.opt_state)
    )


def test_hooks_run_outside_the_compiled_steps_and_give_their_numbers():
    """forward, compute_loss, compute_metrics and train_step called directly (no trace) give what
    predict, evaluate and a compiled step of fit give, within float32 rounding (1e-5)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (32, 4, 4, 1), dtype=np.uint8)
    y = (np.arange(32) % 3).astype(np.int32)
    model = nn.Sequential([lambda v: v.reshape((v.shape[0], -1)), nn.Dense(3)])
    with ef.Trainer(model, optimizer=optax.sgd(0.1), seed=0, steps_per_execution=1) as t:
        t.fit(ef.data.Arrays(x, y, scale=1 / 255), epochs=1, batch_size=32, shuffle=False, verbose=0)
        batch = {"x": x, "y": y, "mask": np.ones(32, bool)}
        outputs, _ = t.forward(t.params, t.state.model_state, x, train=False)  # scaled by 1/255
        np.testing.assert_allclose(np.asarray(outputs), t.predict(x), rtol=1e-5, atol=1e-5)
        per_sample = t.compute_loss(outputs, batch)
        assert per_sample.shape == (32,)
        logs = t.evaluate(x, y, batch_size=32)
        loss = float(ef.training.masked_mean(per_sample, batch["mask"]))
        assert loss == pytest.approx(logs["loss"], rel=1e-5)
        metrics = t.compute_metrics(outputs, batch, per_sample).compute()
        assert float(metrics["accuracy"]) == pytest.approx(logs["accuracy"], abs=1e-6)

        before = jax.device_get(t.state)
        stepped, _ = t.train_step(before, batch)  # eagerly: one step on the whole data
        t.fit(ef.data.Arrays(x, y, scale=1 / 255), epochs=1, batch_size=32, shuffle=False, verbose=0)
        assert int(stepped.step) == int(t.state.step) == 2
        np.testing.assert_allclose(flat_params(stepped.params), flat_params(t.params), rtol=1e-5, atol=1e-6)


def test_compute_loss_outside_a_fit_without_a_loss_says_what_to_do():
    with ef.Trainer(nn.Dense(3)) as t:
        with pytest.raises(ValueError, match="no loss yet: pass loss="):
            t.compute_loss(np.zeros((1, 3)), {"y": np.zeros(1, np.int32)})
