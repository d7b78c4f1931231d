"""Trains the small MLP on the packaged sample with BackupAndRestore; send it SIGTERM, run again.

    python train_preempted.py BACKUP_DIR OUT.npz [--delay 0] [--reference REF_BACKUP_DIR REF_OUT.npz]

Prints ``batch EPOCH BATCH`` after every batch (flushed) and ``train end`` from on_train_end, then
one JSON line; writes the final parameters to OUT.npz. ``--delay`` sleeps after each batch so
that a test can signal it mid-epoch; it changes nothing else. ``--reference``: then trains the
same fit again, from the start, on a new Trainer with its own backup folder (a run never stopped,
without starting another interpreter), writes its parameters to REF_OUT.npz and puts its figures
in the JSON line under ``"reference"``.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import easyfit as ef  # noqa: E402
from tests.helpers.models import SmallMLP  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("backup")
ap.add_argument("out")
ap.add_argument("--delay", type=float, default=0.0)
ap.add_argument("--reference", nargs=2, default=None, metavar=("REF_BACKUP_DIR", "REF_OUT"))
args = ap.parse_args()

(x, y), (xv, yv) = ef.datasets.sample()["train"], ef.datasets.sample()["val"]
train_data = ef.data.Arrays(x[:1500], y[:1500], scale=1 / 255)


def report(batch, logs):
    print(f"batch {trainer.progress.epoch} {batch}", flush=True)
    time.sleep(args.delay)


def train(backup: str, out: str) -> dict:
    """The fit, with ``BackupAndRestore(backup)``; its parameters to ``out``; its figures."""
    global trainer
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=0)
    history = trainer.fit(
        train_data,
        epochs=2,
        batch_size=100,
        verbose=0,
        validation_data=(xv[:300], yv[:300]),
        callbacks=[
            ef.callbacks.BackupAndRestore(backup, save_freq=3),
            ef.callbacks.LambdaCallback(
                on_train_batch_end=report, on_train_end=lambda logs: print("train end", flush=True)
            ),
        ],
    )
    np.savez(out, *[np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(trainer.params)])
    return {"epochs": history.epoch, "step": int(trainer.state.step)}


figures = train(args.backup, args.out)
if args.reference:
    args.delay = 0.0
    figures["reference"] = train(*args.reference)
print(json.dumps(figures))
