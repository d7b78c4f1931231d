"""Trains the small MLP on MNIST arrays with BackupAndRestore; kill it and run it again.

    python train_resume.py MNIST_IDX BACKUP_DIR OUT.npz [--epochs 2] [--save-freq 3]
        [--delay 0] [--steps-per-execution 1] [--reference REF_BACKUP_DIR REF_OUT.npz]

Prints ``batch EPOCH BATCH`` after every batch (flushed), then one JSON line with the last
epoch's logs; writes the final parameters to OUT.npz. ``--delay`` sleeps after each batch so that
a test can kill it mid-epoch; it changes nothing else. ``--reference``: then trains the same fit
again, from the start, on a new Trainer with its own backup folder (a run never stopped, without
starting another interpreter), writes its parameters to REF_OUT.npz and puts its figures in the
JSON line under ``"reference"``.
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
ap.add_argument("mnist")
ap.add_argument("backup")
ap.add_argument("out")
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument("--save-freq", type=int, default=3)
ap.add_argument("--delay", type=float, default=0.0)
ap.add_argument("--steps-per-execution", type=int, default=1)
ap.add_argument("--reference", nargs=2, default=None, metavar=("REF_BACKUP_DIR", "REF_OUT"))
args = ap.parse_args()

data = ef.datasets.mnist_arrays(args.mnist)
(x, y), (xv, yv) = data["train"], data["val"]
train_data = ef.data.Arrays(x[:1500], y[:1500], scale=1 / 255)


def report(batch, logs):
    print(f"batch {trainer.progress.epoch} {batch}", flush=True)
    time.sleep(args.delay)


def train(backup: str, out: str) -> dict:
    """The fit, with ``BackupAndRestore(backup)``; its parameters to ``out``; its figures."""
    global trainer
    trainer = ef.Trainer(
        SmallMLP(), optimizer=optax.adam(1e-3), seed=0, steps_per_execution=args.steps_per_execution
    )
    history = trainer.fit(
        train_data,
        epochs=args.epochs,
        batch_size=100,
        verbose=0,
        validation_data=(xv[:300], yv[:300]),
        callbacks=[
            ef.callbacks.BackupAndRestore(backup, save_freq=args.save_freq),
            ef.callbacks.LambdaCallback(on_train_batch_end=report),
        ],
    )
    leaves = jax.tree_util.tree_leaves(trainer.params)
    np.savez(out, *[np.asarray(leaf) for leaf in leaves])
    return {
        "epochs": history.epoch,
        "last": {k: v[-1] for k, v in history.history.items() if k != "input_wait"},  # a timing, not a result
        "step": int(trainer.state.step),
    }


figures = train(args.backup, args.out)
if args.reference:
    args.delay = 0.0
    figures["reference"] = train(*args.reference)
print(json.dumps(figures))
