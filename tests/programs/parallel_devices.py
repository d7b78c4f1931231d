"""Trains the small MLP on an image folder as tests/programs/train_devices.py does, on 1, 4 and 8
of the process's (virtual) devices in turn (``Trainer(devices=...)``: a mesh of that many), on 4
with 4 steps per dispatch, and asks 8 for a batch of 100; prints one JSON line of figures per
run, keyed by run, and writes each run's trained parameters to OUT/<run>.npz.

    python parallel_devices.py ROOT OUT   (with at least 8 devices)
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import easyfit as ef  # noqa: E402
from tests.helpers.models import SmallMLP  # noqa: E402

root, out = sys.argv[1], Path(sys.argv[2])


def run(devices: int, steps_per_execution: int = 1, batch_size: int = 200) -> dict:
    """train_devices.py's fit, evaluation and figures on the first ``devices`` devices."""
    trainer = ef.Trainer(
        SmallMLP(),
        optimizer=optax.sgd(0.1, momentum=0.9),
        seed=0,
        steps_per_execution=steps_per_execution,
        devices=jax.devices()[:devices],
    )
    try:
        history = trainer.fit(root, epochs=2, batch_size=batch_size, verbose=0)
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
        "params": [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(jax.device_get(trainer.params))],
    }


results = {str(n): run(n) for n in (1, 4, 8)}
results["4-k4"] = run(4, steps_per_execution=4)
results["8-batch-100"] = run(8, batch_size=100)
for name, r in results.items():
    if "params" in r:
        np.savez(out / f"{name}.npz", *r.pop("params"))
print(json.dumps({"process_devices": jax.device_count(), **results}))
