"""One process of a multi-process run that saves ``OUT_DIR/latest`` after every batch.

    python save_multiprocess.py PROCESS_ID NUM_PROCESSES PORT OUT_DIR

Trains the small MLP on 400 images of the packaged sample for 50 epochs (200 steps, a save
after each) with ``ModelCheckpoint(OUT_DIR/latest, save_freq=1)``: the test kills every process
after a few saves, at a random moment, most likely during a save; a process that hangs or saves
nothing still ends.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import easyfit as ef  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("process_id", type=int)
ap.add_argument("num_processes", type=int)
ap.add_argument("port")
ap.add_argument("out")
args = ap.parse_args()

ef.distributed.initialize(
    f"localhost:{args.port}", args.num_processes, args.process_id, heartbeat_timeout_seconds=10
)

import optax  # noqa: E402

from tests.helpers.models import SmallMLP  # noqa: E402

x, y = ef.datasets.sample()["train"]
trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1), seed=0, steps_per_execution=1)
latest = ef.callbacks.ModelCheckpoint(str(Path(args.out) / "latest"), save_freq=1)
print("training", flush=True)
trainer.fit(
    ef.data.Arrays(x[:400], y[:400], scale=1 / 255),
    epochs=50,
    batch_size=100,
    verbose=0,
    callbacks=[latest],
)
