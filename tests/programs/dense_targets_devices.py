"""Trains on a segmentation folder (with augmentation) and on a CSV of regression targets, on
every (virtual) device; saves the parameters and outputs, prints JSON figures.

python dense_targets_devices.py DATA OUT   (DATA: seg/{train,val}/ and csv/{train,val}/{train,val}.csv)
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

data, out = sys.argv[1], Path(sys.argv[2])
figures = {"devices": jax.device_count()}

augment = ef.data.Augment(random_resized_crop=(0.5, 1.0), flip=True)
seg = ef.Trainer(TinySegmenter(), optimizer=optax.adam(0.05), seed=0)
train = ef.data.SegmentationFolder(f"{data}/seg/train", image_size=(16, 16), augment=augment)
history = seg.fit(train, validation_data=f"{data}/seg/val", epochs=2, batch_size=8, verbose=0)
figures["seg_val_loss"] = history.history["val_loss"][-1]
figures["seg_shards"] = len(jax.tree_util.tree_leaves(seg.params)[0].addressable_shards)

csv = ef.Trainer(Regressor(), optimizer=optax.adam(0.1), seed=0)
history = csv.fit(
    f"{data}/csv/train/train.csv",
    validation_data=f"{data}/csv/val/val.csv",
    epochs=3,
    batch_size=4,
    verbose=0,
)
figures["csv_val_loss"] = history.history["val_loss"][-1]

params = [np.asarray(a) for t in (seg, csv) for a in jax.tree_util.tree_leaves(jax.device_get(t.params))]
np.savez(
    out,
    seg_outputs=seg.predict(f"{data}/seg/val", batch_size=8),
    csv_outputs=csv.predict(f"{data}/csv/val/val.csv", batch_size=4),
    **{f"param_{i}": a for i, a in enumerate(params)},
)
print(json.dumps(figures))
