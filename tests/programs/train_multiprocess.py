"""One process of a multi-process run on CPU devices (gloo collectives).

    python train_multiprocess.py ROOT PROCESS_ID NUM_PROCESSES PORT OUT_DIR [--epochs 2]
        [--die-after-epoch E] [--batch-size 200] [--fit-only] [--predict-only]
        [--disagreements ROOT_OF_PROCESS]

Trains the small MLP like train_devices.py; writes OUT_DIR/params.npz (process 0) and
OUT_DIR/seen-<process>.json: the sample ids this process's devices received, per epoch
(not with ``--fit-only``). A fit that raises prints ``<ErrorType>: <message>`` and exits with
status 4. ``--disagreements`` runs three calls in turn, each after a line ``--- <call>``: fit
on ROOT with ``--batch-size`` (``fit-batch-size``), predict on ROOT/val with it
(``predict-batch-size``), and fit on ROOT_OF_PROCESS with batch 200 (``fit-data``); prints each
call's error as above (``no error`` when it raises none) and exits with status 0.
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import easyfit as ef  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("root")
ap.add_argument("process_id", type=int)
ap.add_argument("num_processes", type=int)
ap.add_argument("port")
ap.add_argument("out")
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument(
    "--die-after-epoch", type=int, default=None, help="process 1 exits (code 3) at the end of this epoch"
)
ap.add_argument("--batch-size", type=int, default=200, help="this process's batch size")
ap.add_argument("--fit-only", action="store_true", help="no loader pass, no evaluate, predict or save")
ap.add_argument(
    "--predict-only", action="store_true", help="only predict on val/ with --batch-size (an untrained model)"
)
ap.add_argument(
    "--disagreements",
    default=None,
    help="the fit, predict and data disagreements in turn; this process's root",
)
args = ap.parse_args()

ef.distributed.initialize(
    f"localhost:{args.port}", args.num_processes, args.process_id, heartbeat_timeout_seconds=10
)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from easyfit.data.loader import Loader  # noqa: E402
from easyfit.parallel import Placement  # noqa: E402
from tests.helpers.models import SmallMLP  # noqa: E402


class Die(ef.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == args.die_after_epoch and args.process_id == 1:
            print(f"process {args.process_id} dies", flush=True)
            os._exit(3)


if not (args.fit_only or args.predict_only or args.disagreements):
    # Which samples reach this process's devices, through the real loader.
    n = 1000
    placement = Placement.create()
    ids = ef.data.Arrays(np.arange(n, dtype=np.float32)[:, None], np.zeros(n, np.int32))
    plan = ef.data.Plan(n, 96, seed=0, steps_per_execution=2, num_shards=placement.num_shards)
    loader = Loader(ids, plan, placement)
    seen = []
    for _ in range(2):
        epoch = []
        for _ in range(plan.chunks_per_epoch):
            chunk = next(loader)
            for xs, ms in zip(chunk["x"].addressable_shards, chunk["mask"].addressable_shards):
                epoch += np.asarray(xs.data).ravel()[np.asarray(ms.data)].astype(int).tolist()
        seen.append(epoch)
    loader.close()
    with open(os.path.join(args.out, f"seen-{args.process_id}.json"), "w") as f:
        json.dump(seen, f)

trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0)
if args.disagreements:

    def fresh() -> ef.Trainer:  # each call on a trainer of its own, as if called alone
        return ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0)

    calls = {
        "fit-batch-size": lambda: fresh().fit(args.root, epochs=1, batch_size=args.batch_size, verbose=2),
        "predict-batch-size": lambda: fresh().predict(
            args.root + "/val", batch_size=args.batch_size, verbose=0
        ),
        "fit-data": lambda: fresh().fit(args.disagreements, epochs=1, batch_size=200, verbose=2),
    }
    for name, call in calls.items():
        print(f"--- {name}", flush=True)
        try:
            call()
            print("no error", flush=True)
        except (ValueError, TimeoutError) as e:
            print(f"{type(e).__name__}: {e}", flush=True)
    sys.exit(0)
if args.predict_only:
    try:
        trainer.predict(args.root + "/val", batch_size=args.batch_size, verbose=0)
    except (ValueError, TimeoutError) as e:
        print(f"{type(e).__name__}: {e}", flush=True)
        sys.exit(4)
    sys.exit(0)
try:
    history = trainer.fit(
        args.root, epochs=args.epochs, batch_size=args.batch_size, verbose=2, callbacks=[Die()]
    )
except (ValueError, TimeoutError) as e:
    print(f"{type(e).__name__}: {e}", flush=True)
    sys.exit(4)
if args.fit_only:
    sys.exit(0)
result = trainer.evaluate(args.root + "/val")
predictions = trainer.predict(args.root + "/val")
trainer.save(os.path.join(args.out, "ckpt"))  # every process takes part, as Orbax requires
if ef.distributed.is_main_process():
    leaves = jax.tree_util.tree_leaves(jax.device_get(trainer.params))
    np.savez(os.path.join(args.out, "params.npz"), *leaves)
    print(
        json.dumps(
            {
                "processes": jax.process_count(),
                "devices": jax.device_count(),
                "val_accuracy": history.history["val_accuracy"][-1],
                "evaluate": result,
                "predict_rows": int(predictions.shape[0]),
            }
        )
    )
