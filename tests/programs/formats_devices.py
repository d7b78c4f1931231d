"""Reader-driven (LMDB) and index-driven (RecordIO) sources on every (virtual) device.

    python formats_devices.py MNIST_IDX LMDB_ROOT RECORDIO_ROOT

Prints JSON figures on its last line.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import easyfit as ef  # noqa: E402
from easyfit.data.loader import make_loader  # noqa: E402
from tests.helpers.models import SmallMLP  # noqa: E402

mnist_idx, lmdb_root, recordio_root = sys.argv[1:4]
n = jax.device_count()
trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0)
history = trainer.fit(recordio_root + "/train", validation_split=0.2, epochs=1, batch_size=96, verbose=0)
leaves = jax.tree_util.tree_leaves(trainer.params)
param_sum = float(sum(np.asarray(leaf, np.float64).sum() for leaf in leaves))

lmdb_val = ef.data.Caffe2LMDB(lmdb_root + "/val")
x, y = ef.datasets.mnist_arrays(mnist_idx)["val"]
arrays_val = ef.data.Arrays(x[: len(lmdb_val)], y[: len(lmdb_val)], scale=1 / 255)
lmdb_pred = trainer.predict(lmdb_val, batch_size=8 * 9)
arrays_pred = trainer.predict(arrays_val, batch_size=8 * 9)
same_rows = bool(np.allclose(np.sort(lmdb_pred, axis=0), np.sort(arrays_pred, axis=0), atol=1e-5))
lmdb_eval = trainer.evaluate(lmdb_val, batch_size=8 * 9)
arrays_eval = trainer.evaluate(arrays_val, batch_size=8 * 9)

# One reader per device (as on GPUs): every record once per epoch, through the shards' padding
# and their rotation from epoch to epoch.
plan = ef.data.Plan(len(lmdb_val), 8 * 7, shuffle=True, seed=0, steps_per_execution=2, num_shards=n)
loader = make_loader(lmdb_val, plan, trainer.placement, pipelines=n)
epochs_exact = []
for _ in range(3):
    labels = []
    for _ in range(loader.plan.chunks_per_epoch):
        chunk = next(loader)
        labels.append(np.asarray(chunk["y"])[np.asarray(chunk["mask"])])
    epochs_exact.append(sorted(np.concatenate(labels).tolist()) == sorted(arrays_val.y.tolist()))
loader.close()
lmdb_history = trainer.fit(lmdb_root, epochs=1, batch_size=96, verbose=0)

print(
    json.dumps(
        {
            "devices": n,
            "val_accuracy": history.history["val_accuracy"][-1],
            "val_loss": history.history["val_loss"][-1],
            "param_sum": param_sum,
            "lmdb_predict_rows": int(lmdb_pred.shape[0]),
            "lmdb_rows_match_arrays": same_rows,
            "lmdb_eval": lmdb_eval,
            "arrays_eval": arrays_eval,
            "reader_epochs_exact": epochs_exact,
            "lmdb_fit_val_accuracy": lmdb_history.history["val_accuracy"][-1],
        }
    )
)
