"""Trains on a segmentation folder (with augmentation) and on a CSV of regression targets, on the
first 1 and the first 4 of the process's (virtual) devices (``Trainer(devices=...)``: a mesh of
that many); saves each run's parameters and outputs to OUT-<devices>.npz, prints one JSON line
of figures keyed by the number of devices.

python dense_targets_devices.py DATA OUT   (DATA: seg/{train,val}/ and csv/{train,val}/{train,val}.csv;
with at least 4 devices)
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import easyfit as ef  # noqa: E402
from tests.helpers.dense import Regressor, TinySegmenter  # noqa: E402

data, out = sys.argv[1], sys.argv[2]


def run(n: int) -> dict:
    devices = jax.devices()[:n]
    figures = {}
    augment = ef.data.Augment(random_resized_crop=(0.5, 1.0), flip=True)
    seg = ef.Trainer(TinySegmenter(), optimizer=optax.adam(0.05), seed=0, devices=devices)
    train = ef.data.SegmentationFolder(f"{data}/seg/train", image_size=(16, 16), augment=augment)
    history = seg.fit(train, validation_data=f"{data}/seg/val", epochs=2, batch_size=8, verbose=0)
    figures["seg_val_loss"] = history.history["val_loss"][-1]
    figures["seg_shards"] = len(jax.tree_util.tree_leaves(seg.params)[0].addressable_shards)

    csv = ef.Trainer(Regressor(), optimizer=optax.adam(0.1), seed=0, devices=devices)
    history = csv.fit(
        f"{data}/csv/train/train.csv",
        validation_data=f"{data}/csv/val/val.csv",
        epochs=3,
        batch_size=4,
        verbose=0,
    )
    figures["csv_val_loss"] = history.history["val_loss"][-1]
    figures["devices"] = len(csv.placement.devices)

    params = [np.asarray(a) for t in (seg, csv) for a in jax.tree_util.tree_leaves(jax.device_get(t.params))]
    np.savez(
        f"{out}-{n}.npz",
        seg_outputs=seg.predict(f"{data}/seg/val", batch_size=8),
        csv_outputs=csv.predict(f"{data}/csv/val/val.csv", batch_size=4),
        **{f"param_{i}": a for i, a in enumerate(params)},
    )
    return figures


print(json.dumps({n: run(n) for n in (1, 4)}))
