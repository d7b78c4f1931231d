"""Keras' classification metrics (``ef.metrics``, and their names as strings) against values
computed independently: scikit-learn's precision, recall, F1, ROC AUC and Jaccard index, NumPy's
hinge and binary accuracy. The metrics' states are summed on the device over batches whose last
is padded with rows that would change every value if they counted, and over 4 devices."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn import metrics as skm

import easyfit as ef
from easyfit.core.metrics import build_collection, compute_on_host
from easyfit.core.multi_output import loss_function

N = 37  # 4 full batches of 8 and one of 5 valid rows, padded to 8


def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _run(metrics, loss, outputs, labels, batch=8):
    """The metrics of ``outputs`` against ``labels``, summed batch by batch in a jitted step;
    the last batch padded with confident wrong rows that the mask must leave out."""
    collection = build_collection(metrics, loss, jnp.asarray(labels[:batch]))

    @jax.jit
    def step(acc, out, y, mask):
        m = collection.single_from_model_output(
            outputs=out, logits=out, labels=y, loss=jnp.zeros(out.shape[0]), mask=mask
        )
        return acc.merge(m)

    acc = collection.empty()
    for start in range(0, len(outputs), batch):
        out, y = outputs[start : start + batch], labels[start : start + batch]
        valid = len(out)
        if valid < batch:  # padding: outputs of +8 everywhere, labels of 0
            out = np.concatenate([out, np.full((batch - valid, *out.shape[1:]), 8.0, out.dtype)])
            y = np.concatenate([y, np.zeros((batch - valid, *y.shape[1:]), y.dtype)])
        acc = step(acc, jnp.asarray(out), jnp.asarray(y), jnp.arange(batch) < valid)
    return compute_on_host(acc)


def test_binary_metrics_match_scikit_learn():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, N)
    logits = (rng.normal(size=(N, 1)) + (y[:, None] - 0.5)).astype(np.float32)
    got = _run(
        [
            "auc",
            ef.metrics.AUC(num_thresholds=20001, name="fine_auc"),
            "precision",
            "recall",
            ef.metrics.F1Score(threshold=0.5),
            "binary_accuracy",
            "hinge",
        ],
        "binary_crossentropy",
        logits,
        y,
    )
    p = _sigmoid(logits[:, 0].astype(np.float64))
    pred = (p > 0.5).astype(int)
    roc = skm.roc_auc_score(y, p)
    # 200 thresholds: Keras' default Riemann sum, within a bucket's width of the exact area
    assert got["auc"] == pytest.approx(roc, abs=1e-2)
    assert got["fine_auc"] == pytest.approx(roc, abs=1e-4)
    assert got["precision"] == pytest.approx(skm.precision_score(y, pred), abs=1e-6)
    assert got["recall"] == pytest.approx(skm.recall_score(y, pred), abs=1e-6)
    assert got["f1_score"] == pytest.approx(skm.f1_score(y, pred), abs=1e-5)  # Keras' epsilon
    assert got["binary_accuracy"] == pytest.approx((pred == y).mean(), abs=1e-6)
    hinge = np.maximum(1 - (2 * y - 1) * logits[:, 0], 0).mean()
    assert got["hinge"] == pytest.approx(hinge, rel=1e-5)


def test_multiclass_f1_iou_and_flattened_auc_match_scikit_learn():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 4, (N, 3, 3))  # a class per pixel, 3x3 pixels per sample
    logits = (rng.normal(size=(N, 3, 3, 4)) + 1.5 * np.eye(4)[y]).astype(np.float32)
    f1s = [
        ef.metrics.F1Score(average=a, num_classes=4, name=f"f1_{a}") for a in ("micro", "macro", "weighted")
    ]
    got = _run(
        ["auc", "precision", "recall", ef.metrics.MeanIoU(num_classes=4), ef.metrics.F1Score(num_classes=4)]
        + f1s,
        "sparse_categorical_crossentropy",
        logits,
        y,
    )
    true, pred = y.reshape(-1), logits.reshape(-1, 4).argmax(-1)
    assert got["mean_iou"] == pytest.approx(skm.jaccard_score(true, pred, average="macro"), abs=1e-5)
    per_class = skm.f1_score(true, pred, average=None, labels=range(4))
    np.testing.assert_allclose([got[f"f1_score_{i}"] for i in range(4)], per_class, atol=1e-5)
    for average in ("micro", "macro", "weighted"):
        expected = skm.f1_score(true, pred, average=average, labels=range(4))
        assert got[f"f1_{average}"] == pytest.approx(expected, abs=1e-5), average
    # Keras' AUC, precision and recall flatten the softmax probabilities against one-hot labels
    onehot, p = np.eye(4)[true].ravel(), _softmax(logits.reshape(-1, 4).astype(np.float64)).ravel()
    assert got["auc"] == pytest.approx(skm.roc_auc_score(onehot, p), abs=1e-2)
    assert got["precision"] == pytest.approx(skm.precision_score(onehot, p > 0.5), abs=1e-6)
    assert got["recall"] == pytest.approx(skm.recall_score(onehot, p > 0.5), abs=1e-6)


def test_auc_follows_keras_thresholds_and_summation():
    """Keras' own example (AUC(num_thresholds=3): 0.75), and the PR curve's interpolation with
    many thresholds against scikit-learn's average precision."""
    y, p = np.array([0, 0, 1, 1]), np.array([[0.0], [0.5], [0.3], [0.9]], np.float32)
    got = _run([ef.metrics.AUC(num_thresholds=3, from_logits=False)], "mse", p, y, batch=4)
    assert got["auc"] == pytest.approx(0.75, abs=1e-6)
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, N)
    p = rng.uniform(size=(N, 1)).astype(np.float32) * 0.6 + 0.4 * y[:, None]
    pr = ef.metrics.AUC(curve="PR", num_thresholds=20001, from_logits=False)
    got = _run([pr, ef.metrics.AUC(thresholds=[0.25, 0.5, 0.75], from_logits=False, name="few")], "mse", p, y)
    assert got["auc"] == pytest.approx(skm.average_precision_score(y, p[:, 0]), abs=2e-2)
    # explicit thresholds: the interpolated ROC area over the points at -eps, 0.25, 0.5, 0.75, 1+eps
    fpr = [((p[:, 0] > t) & (y == 0)).sum() / (y == 0).sum() for t in (-1e-7, 0.25, 0.5, 0.75, 1.1)]
    tpr = [((p[:, 0] > t) & (y == 1)).sum() / (y == 1).sum() for t in (-1e-7, 0.25, 0.5, 0.75, 1.1)]
    expected = sum((fpr[i] - fpr[i + 1]) * (tpr[i] + tpr[i + 1]) / 2 for i in range(4))
    assert got["few"] == pytest.approx(expected, abs=1e-6)
    # multi_label: one ROC area per label column, averaged (scikit-learn's macro average)
    y = rng.integers(0, 2, (N, 3))
    p = (rng.uniform(size=(N, 3)) * 0.7 + 0.3 * y).astype(np.float32)
    multi = ef.metrics.AUC(multi_label=True, num_labels=3, num_thresholds=20001, from_logits=False)
    got = _run([multi], "mse", p, y)
    assert got["auc"] == pytest.approx(skm.roc_auc_score(y, p, average="macro"), abs=1e-3)


def test_precision_and_recall_top_k_class_id_and_a_list_of_thresholds():
    """Keras' top_k (exactly the k highest of each row may be positive), class_id (one column)
    and a list of thresholds (one value each, logged as precision_0, precision_1, ...)."""
    p = np.array([[0.9, 0.8, 0.7, 0.1], [0.1, 0.6, 0.7, 0.97], [0.5, 0.5, 0.5, 0.5]], np.float32)
    y = np.array([[0, 1, 1, 0], [1, 0, 0, 1], [1, 1, 0, 0]], np.float32)
    got = _run(
        [
            ef.metrics.Precision(top_k=2, from_logits=False),
            ef.metrics.Recall(top_k=2, from_logits=False),
            ef.metrics.Precision(class_id=1, thresholds=[0.5, 0.7], from_logits=False, name="p1"),
        ],
        "mse",
        p,
        y,
        batch=3,
    )
    top2 = np.zeros_like(y, bool)  # rows' two highest; the tied row: its first two columns
    top2[[0, 0, 1, 1, 2, 2], [0, 1, 3, 2, 0, 1]] = True
    assert got["precision"] == pytest.approx(skm.precision_score(y.ravel(), top2.ravel()), abs=1e-6)
    assert got["recall"] == pytest.approx(skm.recall_score(y.ravel(), top2.ravel()), abs=1e-6)
    assert [got["p1_0"], got["p1_1"]] == pytest.approx([0.5, 1.0], abs=1e-6)  # 0.8 and 0.6 above 0.5


def test_arguments_and_layouts_are_checked():
    with pytest.raises(ValueError, match="F1Score: average='mean'"):
        ef.metrics.F1Score(average="mean")
    with pytest.raises(ValueError, match="num_labels"):
        ef.metrics.AUC(multi_label=True)
    with pytest.raises(ValueError, match=r"F1Score\(num_classes=N"):  # class indices: no count
        build_collection(["f1_score"], "sparse_categorical_crossentropy", jnp.zeros(4, jnp.int32))
    with pytest.raises(ValueError, match="two metrics are named 'auc'"):
        build_collection(["auc", ef.metrics.AUC(curve="PR")], "binary_crossentropy")


def test_per_output_metrics_and_their_directions():
    """A model of two outputs: each output's metrics get its own outputs, labels and loss's
    activation (softmax for the classes, sigmoid for the flag); each declares its direction."""
    y = {"kind": jnp.array([0, 1, 2, 1]), "flag": jnp.array([[1.0], [0.0], [1.0], [0.0]])}
    loss = loss_function({"kind": "sparse_categorical_crossentropy", "flag": "binary_crossentropy"}, None, y)
    fields = loss.metric_fields(
        {"kind": [ef.metrics.F1Score(num_classes=3, average="macro")], "flag": ["precision", "hinge"]}, y
    )
    out = {"kind": 3 * jnp.eye(3)[jnp.array([0, 1, 1, 1])], "flag": jnp.array([[2.0], [-1.0], [-0.5], [1.0]])}
    collection = build_collection(fields)
    got = compute_on_host(
        jax.jit(
            lambda out, y: collection.single_from_model_output(
                outputs=out, logits=out, labels=y, loss=jnp.zeros(4), mask=jnp.ones(4, bool)
            )
        )(out, y)
    )
    f1 = skm.f1_score([0, 1, 2, 1], [0, 1, 1, 1], average="macro", labels=range(3))
    assert got["kind_f1_score"] == pytest.approx(f1, abs=1e-5)
    assert got["flag_precision"] == pytest.approx(0.5, abs=1e-6)  # logits > 0: rows 0 and 3
    hinge = np.maximum(1 - np.array([1, -1, 1, -1]) * np.array([2.0, -1.0, -0.5, 1.0]), 0).mean()
    assert got["flag_hinge"] == pytest.approx(hinge, rel=1e-6)
    directions = {k: getattr(v, "_direction", None) for k, v in fields.items() if k != "flag_loss"}
    assert directions == {
        "kind_loss": None,
        "kind_f1_score": "up",
        "flag_precision": "up",
        "flag_hinge": "down",
    }
    named = build_collection(["auc", "recall", "binary_accuracy", "categorical_accuracy", "hinge"])
    fields = [f for f in dataclasses.fields(named) if not f.name.startswith("_")]
    assert {f.name: getattr(f.type, "_direction", None) for f in fields} == {
        "loss": None,
        "auc": "up",
        "recall": "up",
        "binary_accuracy": "up",
        "categorical_accuracy": "up",
        "hinge": "down",
    }


def _fit_program(devices: int) -> str:
    return textwrap.dedent(
        f"""
        import json, sys
        import numpy as np, optax
        from flax import linen as nn
        import easyfit as ef
        import jax
        assert jax.device_count() == {devices}

        class Net(nn.Module):
            @nn.compact
            def __call__(self, x):
                return nn.Dense(3)(x)

        rng = np.random.default_rng(3)
        x = rng.normal(size=(45, 6)).astype(np.float32)
        y = (x[:, :3] + 0.5 * rng.normal(size=(45, 3))).argmax(-1).astype(np.int32)
        onehot = np.eye(3, dtype=np.float32)[y]
        trainer = ef.Trainer(Net(), optimizer=optax.adam(1e-2), seed=0,
                             metrics=["auc", "precision", "recall", "f1_score",
                                      "categorical_accuracy", ef.metrics.MeanIoU(num_classes=3)])
        stop = ef.callbacks.EarlyStopping(monitor="val_f1_score_0", patience=5)
        history = trainer.fit(x, onehot, epochs=2, batch_size=8, verbose=0,
                              validation_data=(x, onehot), callbacks=[stop])
        result = trainer.evaluate(x, onehot, batch_size=8)  # 45 = 5 * 8 + 5: a padded batch
        directions = {{k: trainer.metric_direction(k) for k in ("auc", "f1_score_2", "mean_iou")}}
        json.dump({{"result": result, "logits": trainer.predict(x, batch_size=8).tolist(),
                    "y": y.tolist(), "directions": directions,
                    "keys": sorted(history.history)}}, sys.stdout)
        """
    )


@pytest.mark.slow
def test_fit_and_evaluate_by_name_on_four_devices():
    """One fit and evaluate with Keras' names on 4 devices: evaluate's values are those of
    predict's outputs (the padded batch's extra rows never count), and the monitor's auto mode
    knows the metrics' direction (f1 per class included)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _fit_program(4)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    result, logits, y = out["result"], np.asarray(out["logits"], np.float64), np.asarray(out["y"])
    pred, p, onehot = logits.argmax(-1), _softmax(logits), np.eye(3)[y]
    assert result["categorical_accuracy"] == pytest.approx((pred == y).mean(), abs=1e-6)
    np.testing.assert_allclose(
        [result[f"f1_score_{i}"] for i in range(3)], skm.f1_score(y, pred, average=None), atol=1e-4
    )
    assert result["mean_iou"] == pytest.approx(skm.jaccard_score(y, pred, average="macro"), abs=1e-4)
    assert result["auc"] == pytest.approx(skm.roc_auc_score(onehot.ravel(), p.ravel()), abs=1e-2)
    assert result["precision"] == pytest.approx(
        skm.precision_score(onehot.ravel(), p.ravel() > 0.5), abs=1e-4
    )
    assert result["recall"] == pytest.approx(skm.recall_score(onehot.ravel(), p.ravel() > 0.5), abs=1e-4)
    assert out["directions"] == {"auc": "up", "f1_score_2": "up", "mean_iou": "up"}
    assert {"val_auc", "val_f1_score_0", "val_mean_iou", "f1_score_2"} <= set(out["keys"])
