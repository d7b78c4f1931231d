"""Data-parallel scaling: one run of a reference program on the first N devices; prints JSON.

    python benchmarks/scaling.py DATA --model mlp|cnn [--devices N] [--epochs 5]
        [--per-device-batch B] [--cache false|true|auto] [--check-once]

DATA is an image folder with ``train/`` and ``val/`` (MNIST written by
``benchmarks/make_data.py``) or, for the CNN, MNIST's gzipped IDX files (in memory,
as in the Gluon tutorial). The global batch is ``B * N`` (reference program 1: 200 per device,
reference program 2: 64). Printed: steady samples/s (median of epochs 2..N, training only),
first-epoch seconds, final validation accuracy, whether the replicas hold identical parameters,
and with ``--check-once`` whether the real loader delivers every sample exactly once per epoch
on these devices (arrays and a PNG folder whose pixels encode each sample's index).

Run each device count in its own process, giving each the same cores per device (for example
``CUDA_VISIBLE_DEVICES=0 taskset -c 0-15`` for one GPU of a 32-core, 2-GPU machine); scaling
efficiency is ``samples/s(N) / (N * samples/s(1))``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from mnist_cnn import CNN, load  # noqa: E402
from run_easyfit import EpochTimer  # noqa: E402

import easyfit as ef  # noqa: E402
from easyfit._demo import MLP  # noqa: E402
from easyfit.data.loader import Loader  # noqa: E402
from easyfit.parallel import Placement  # noqa: E402

SETTINGS = {"mlp": (MLP, lambda: optax.sgd(0.1, momentum=0.9), 200), "cnn": (CNN, lambda: optax.sgd(0.3), 64)}


def replicas_identical(params) -> bool:
    return all(
        np.array_equal(np.asarray(s.data), np.asarray(leaf.addressable_shards[0].data))
        for leaf in jax.tree_util.tree_leaves(params)
        for s in leaf.addressable_shards
    )


def seen_once(source, devices, batch_size: int, epochs: int = 2, decode=None) -> bool:
    """Whether the real loader, on ``devices``, delivers each sample once in each epoch."""
    placement = Placement.create(devices)
    plan = ef.data.Plan(
        len(source), batch_size, seed=0, steps_per_execution=3, num_shards=placement.num_shards
    )
    loader = Loader(source, plan, placement)
    try:
        for _ in range(epochs):
            ids = []
            for _ in range(plan.chunks_per_epoch):
                chunk = next(loader)
                x, mask = np.asarray(chunk["x"]), np.asarray(chunk["mask"])
                ids.append((decode or (lambda a: a.reshape(len(a), -1)[:, 0]))(x)[mask])
            if sorted(np.concatenate(ids).astype(int).tolist()) != list(range(len(source))):
                return False
    finally:
        loader.close()
    return True


def check_once(devices, batch_size: int) -> dict[str, bool]:
    n = 2_000
    arrays = ef.data.Arrays(np.arange(n, dtype=np.float32)[:, None], np.arange(n) % 10)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):  # index i in the first two pixels of image i
            image = np.zeros((28, 28), np.uint8)
            image[0, 0], image[0, 1] = i % 256, i // 256
            os.makedirs(f"{tmp}/{i % 10}", exist_ok=True)
            ef.datasets.write_png(f"{tmp}/{i % 10}/{i:05d}.png", image)
        folder = ef.data.ImageFolder(tmp)
        # folder.files is sorted by class then name: map decoded ids back to positions
        position = {int(Path(f).stem): p for p, f in enumerate(folder.files)}
        ids = np.vectorize(position.get)

        def decode(x):
            return ids(x[:, 0, 0, 0].astype(int) + 256 * x[:, 0, 1, 0].astype(int))

        return {
            "arrays": seen_once(arrays, devices, batch_size),
            "image_folder": seen_once(folder, devices, batch_size, decode=decode),
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--model", choices=sorted(SETTINGS), default="mlp")
    ap.add_argument("--devices", type=int, default=None, help="use the first N devices")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--per-device-batch", type=int, default=None)
    ap.add_argument(
        "--cache",
        choices=("false", "true", "auto"),
        default="false",
        help="fit's cache= (default false: streaming)",
    )
    ap.add_argument("--check-once", action="store_true")
    args = ap.parse_args()

    devices = jax.devices()[: args.devices] if args.devices else jax.devices()
    model, optimizer, per_device = SETTINGS[args.model]
    batch_size = (args.per_device_batch or per_device) * len(devices)
    train, val = load(args.data) if args.model == "cnn" else (args.data, None)
    trainer = ef.Trainer(model(), optimizer=optimizer(), seed=0, devices=devices)
    timer = EpochTimer()
    history = trainer.fit(
        train,
        validation_data=val,
        epochs=args.epochs,
        batch_size=batch_size,
        callbacks=[timer],
        verbose=2,
        cache={"false": False, "true": True, "auto": "auto"}[args.cache],
    )
    n = trainer._data._sources.train.num_samples  # noqa: SLF001 - a benchmark may look inside
    rates = [n / s for s in timer.seconds]
    result = {
        "model": args.model,
        "devices": len(devices),
        "platform": devices[0].platform,
        "batch_size": batch_size,
        "cache": args.cache,
        "steady_samples_per_s": round(statistics.median(rates[1:]) if len(rates) > 1 else rates[0]),
        "first_epoch_s": round(timer.seconds[0], 3),
        "val_accuracy": round(history.history["val_accuracy"][-1], 4),
        "replicas_identical": replicas_identical(trainer.params),
    }
    if args.check_once:
        result["every_sample_once"] = check_once(devices, batch_size)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
