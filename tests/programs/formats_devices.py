"""Reader-driven (LMDB, streamed and device-cached) and index-driven (RecordIO) sources on
the first 1 and the first 4 of the process's (virtual) devices in turn (``Trainer(devices=...)``:
a mesh of that many).

    python formats_devices.py MNIST_IDX LMDB_ROOT RECORDIO_ROOT OUT   (with at least 4 devices)

Prints JSON figures keyed by the number of devices on its last line; writes the trained
parameters to OUT/params-<devices>.npz (the RecordIO fit) and OUT/cached_params-<devices>.npz
(the device-cached LMDB fit).
"""

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import easyfit as ef  # noqa: E402
from easyfit.callbacks import BackupAndRestore  # noqa: E402
from easyfit.data import Loader  # noqa: E402
from easyfit.data.loader import open_stream  # noqa: E402
from tests.helpers import Crash, crash_at  # noqa: E402
from tests.helpers.models import SmallMLP  # noqa: E402

mnist_idx, lmdb_root, recordio_root, out = sys.argv[1:5]


def run(n: int) -> dict:
    """Everything below on a mesh of the first ``n`` devices; the figures."""
    devices = jax.devices()[:n]
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0, devices=devices)
    history = trainer.fit(recordio_root + "/train", validation_split=0.2, epochs=1, batch_size=96, verbose=0)
    np.savez(Path(out) / f"params-{n}.npz", *jax.tree_util.tree_leaves(jax.device_get(trainer.params)))

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
    loader = Loader(lmdb_val, plan, trainer.placement, pipelines=n)
    epochs_exact = []
    for _ in range(3):
        labels = []
        for _ in range(loader.plan.chunks_per_epoch):
            chunk = next(loader)
            labels.append(np.asarray(chunk["y"])[np.asarray(chunk["mask"])])
        epochs_exact.append(sorted(np.concatenate(labels).tolist()) == sorted(arrays_val.y.tolist()))
    loader.close()
    lmdb_history = trainer.fit(lmdb_root, epochs=1, batch_size=96, verbose=0, cache=False)

    # The device cache of the LMDB, read once by one reader per device (each shard padded): every
    # epoch the plan's permutation of the key order, so the same batches on any number of devices.
    cached = open_stream(lmdb_val, plan, trainer.placement, cached=True, pipelines=n)
    cache_exact = []
    for i in range(3 * plan.chunks_per_epoch):
        index, mask = plan.chunk(i)
        chunk = next(cached)
        cache_exact.append(
            bool(np.array_equal(np.asarray(chunk["mask"]), mask))
            and bool(np.array_equal(np.asarray(chunk["x"]), arrays_val.x[index]))
            and bool(np.array_equal(np.asarray(chunk["y"]), arrays_val.y[index]))
        )
    cached.close()

    def cached_fit(callbacks=(), trainer=None):
        t = trainer or ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=3, devices=devices)
        t.fit(lmdb_root + "/train", epochs=2, batch_size=96, verbose=0, cache=True, callbacks=list(callbacks))
        return t

    uninterrupted = cached_fit()
    crashing = ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=3, devices=devices)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            cached_fit(
                [BackupAndRestore(tmp + "/b", save_freq=2), crash_at(crashing, 1, 5)], trainer=crashing
            )
        except Crash:
            point = BackupAndRestore(tmp + "/b").restore_point()
            resumed_at = [point.epoch, point.batch, point.position]
        resumed = cached_fit([BackupAndRestore(tmp + "/b")])
    cached_leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(uninterrupted.params)]
    np.savez(Path(out) / f"cached_params-{n}.npz", *cached_leaves)
    cached_resume_exact = all(
        np.array_equal(a, np.asarray(b))
        for a, b in zip(cached_leaves, jax.tree_util.tree_leaves(resumed.params), strict=True)
    )

    return {
        "devices": len(trainer.placement.devices),
        "val_accuracy": history.history["val_accuracy"][-1],
        "val_loss": history.history["val_loss"][-1],
        "lmdb_predict_rows": int(lmdb_pred.shape[0]),
        "lmdb_rows_match_arrays": same_rows,
        "lmdb_eval": lmdb_eval,
        "arrays_eval": arrays_eval,
        "reader_epochs_exact": epochs_exact,
        "lmdb_fit_val_accuracy": lmdb_history.history["val_accuracy"][-1],
        "reader_cache_exact": cache_exact,
        "reader_chunks_per_epoch": plan.chunks_per_epoch,
        "cached_resume_exact": cached_resume_exact,
        "cached_resumed_at": resumed_at,
        "cached_accuracy": uninterrupted.history.history["accuracy"][-1],
    }


print(json.dumps({n: run(n) for n in (1, 4)}))
