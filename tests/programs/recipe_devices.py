"""A model trained, saved (``trainer.save``, ModelCheckpoint, BackupAndRestore) and loaded
(``load``, ``from_checkpoint``) predicts and evaluates what the trainer that trained did, on
every (virtual) device: an image folder of varied sizes under a crop recipe, a Caffe2 LMDB and
arrays.

    python recipe_devices.py WORKDIR

Prints JSON on its last line: for each data kind and each way of loading, the largest
difference of the predictions and of the evaluation's numbers from the trainer that trained.
"""

import json
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import easyfit as ef  # noqa: E402
from easyfit.callbacks import BackupAndRestore, ModelCheckpoint  # noqa: E402
from easyfit.callbacks.backup_and_restore import BACKUPS  # noqa: E402
from tests.helpers.formats import encode, write_lmdb  # noqa: E402
from tests.helpers.models import SmallMLP  # noqa: E402

work = Path(sys.argv[1])
rng = np.random.default_rng(0)
NORMALIZE = ((0.5, 0.4, 0.3), (0.25, 0.2, 0.3))


def images(n: int) -> tuple[list[np.ndarray], np.ndarray]:
    """RGB images of varied sizes whose class (0..2) is their brightest channel."""
    labels = rng.integers(0, 3, n)
    out = []
    for label in labels:
        h, w = (int(v) for v in rng.integers(18, 30, 2))
        img = rng.integers(0, 160, (h, w, 3)).astype(np.uint8)
        img[..., label] += 40
        out.append(img)
    return out, labels


def folder(root: Path, imgs: list[np.ndarray], labels: np.ndarray) -> str:
    for i, (img, label) in enumerate(zip(imgs, labels, strict=True)):
        d = root / "abc"[label]
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:03d}.png").write_bytes(encode(img))
    return str(root)


def diffs(reference: ef.Trainer, loaded: dict[str, ef.Trainer], data: str) -> dict[str, dict[str, float]]:
    """Per way of loading, the largest difference of the predictions from the reference's, and
    of the evaluation's numbers for the first one."""
    want = reference.predict(data, batch_size=16)
    ev_want = reference.evaluate(data, batch_size=16)
    out = {}
    for i, (how, trainer) in enumerate(loaded.items()):
        out[how] = {"predict": float(np.abs(trainer.predict(data, batch_size=16) - want).max())}
        if i == 0:
            ev = trainer.evaluate(data, batch_size=16)
            out[how].update(
                evaluate=max(abs(ev[k] - ev_want[k]) for k in ev_want), accuracy=ev_want["accuracy"]
            )
    return out


results: dict = {"devices": jax.device_count()}
with warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)  # a checkpoint without a recipe warns: none here

    # ---- an image folder of varied sizes, random resized crops in training, a center crop after
    train_imgs, train_y = images(64)
    val_imgs, val_y = images(32)
    root = work / "folder"
    folder(root / "train", train_imgs, train_y)
    val = folder(root / "val", val_imgs, val_y)
    source = ef.data.ImageFolder(
        root / "train",
        image_size=(16, 16),
        augment=ef.data.Augment(random_resized_crop=(0.5, 1.0), flip=True),
        normalize=NORMALIZE,
    )
    keep = ModelCheckpoint(str(work / "mc"))
    backup = BackupAndRestore(work / "backup", delete_checkpoint=False)
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-2), seed=0)
    trainer.fit(source, epochs=2, batch_size=16, verbose=0, callbacks=[keep, backup])
    saved = trainer.save(work / "saved")
    backups = work / "backup" / BACKUPS  # BackupAndRestore's own directory in backup_dir
    step = max(int(s) for s in os.listdir(backups) if s.isdigit())
    loaded_by = {
        "from_checkpoint": ef.Trainer.from_checkpoint(saved, SmallMLP()),
        "model_checkpoint": ef.Trainer.from_checkpoint(work / "mc", SmallMLP(), optimizer=optax.adam(1e-2)),
        "backup_and_restore": ef.Trainer.from_checkpoint(backups / str(step), SmallMLP()),
    }
    plain = ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-2))
    plain.load(saved)
    loaded_by["load"] = plain
    results["folder"] = diffs(trainer, loaded_by, val)
    results["recipe"] = ef.checkpoint.read_metadata(saved)["recipe"]

    # ---- a Caffe2 LMDB of the same images, resized (no crop) and normalised
    lmdb = work / "lmdb"
    write_lmdb(lmdb / "train", [encode(i) for i in train_imgs], train_y)
    write_lmdb(lmdb / "val", [encode(i) for i in val_imgs], val_y)
    source = ef.data.Caffe2LMDB(lmdb / "train", image_size=(16, 16), normalize="imagenet")
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-2), seed=0)
    trainer.fit(source, epochs=2, batch_size=16, verbose=0, cache=False)
    saved = trainer.save(work / "lmdb-saved")
    loaded = ef.Trainer.from_checkpoint(saved, SmallMLP())
    results["lmdb"] = diffs(trainer, {"from_checkpoint": loaded}, str(lmdb / "val"))

    # ---- arrays: uint8 images scaled by 1/255; predicting a raw uint8 array after a load
    x = np.stack([img[:16, :16] for img in train_imgs])
    xv = np.stack([img[:16, :16] for img in val_imgs])
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-2), seed=0)
    trainer.fit(ef.data.Arrays(x, train_y, scale=1 / 255), epochs=2, batch_size=16, verbose=0)
    saved = trainer.save(work / "arrays-saved")
    loaded = ef.Trainer.from_checkpoint(saved, SmallMLP())
    want = trainer.predict(ef.data.Arrays(xv, scale=1 / 255), batch_size=16)
    ev_want = trainer.evaluate(ef.data.Arrays(xv, val_y, scale=1 / 255), batch_size=16)
    ev = loaded.evaluate(xv, val_y, batch_size=16)
    results["arrays"] = {
        "from_checkpoint": {
            "predict": float(np.abs(loaded.predict(xv, batch_size=16) - want).max()),
            "evaluate": max(abs(ev[k] - ev_want[k]) for k in ev_want),
            "accuracy": ev_want["accuracy"],
        }
    }
    results["arrays_recipe"] = ef.checkpoint.read_metadata(saved)["recipe"]

print(json.dumps(results))
