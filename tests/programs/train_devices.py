"""Trains the small MLP on an image folder on every (virtual) device; prints JSON figures.

python train_devices.py ROOT [--batch-size 200] [--epochs 2] [--steps-per-execution 1]
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import easyfit as ef  # noqa: E402
from tests.helpers.models import SmallMLP  # noqa: E402


def fit_figures(
    root: str,
    devices: int | None = None,
    steps_per_execution: int = 1,
    batch_size: int = 200,
    epochs: int = 2,
) -> dict:
    """Fits on the first ``devices`` devices (all: None), evaluates and predicts; the figures,
    and the trained parameters under ``"params"`` (or ``{"error": ...}`` when ``batch_size``
    does not split over the devices)."""
    trainer = ef.Trainer(
        SmallMLP(),
        optimizer=optax.sgd(0.1, momentum=0.9),
        seed=0,
        steps_per_execution=steps_per_execution,
        devices=None if devices is None else jax.devices()[:devices],
    )
    try:
        history = trainer.fit(root, epochs=epochs, batch_size=batch_size, verbose=0)
    except ValueError as e:  # batch_size not splitting over the devices
        return {"error": str(e)}
    leaves = jax.tree_util.tree_leaves(trainer.params)
    replicas_identical = all(
        all(
            np.array_equal(np.asarray(s.data), np.asarray(leaf.addressable_shards[0].data))
            for s in leaf.addressable_shards
        )
        for leaf in leaves
    )
    predictions = trainer.predict(root + "/val")
    return {
        "devices": len(trainer.placement.devices),
        "shards_per_leaf": len(leaves[0].addressable_shards),
        "val_accuracy": history.history["val_accuracy"][-1],
        "replicas_identical": replicas_identical,
        "predict_rows": int(predictions.shape[0]),
        "param_sum": float(sum(np.asarray(leaf, np.float64).sum() for leaf in leaves)),
        "params": [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(jax.device_get(trainer.params))],
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--batch-size", type=int, default=200)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps-per-execution", type=int, default=1)
    ap.add_argument("--save", default=None, help="write the trained parameters to this .npz")
    args = ap.parse_args()
    figures = fit_figures(args.root, None, args.steps_per_execution, args.batch_size, args.epochs)
    params = figures.pop("params", None)
    if args.save and params is not None:
        np.savez(args.save, *params)
    print(json.dumps(figures))
