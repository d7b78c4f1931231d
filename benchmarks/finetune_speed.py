"""Fine-tuning speed of ``ef.models``: the whole model or the head alone, streamed from a folder
with the ImageNet recipe, against the same fit on batches already on the device.

    python benchmarks/finetune_speed.py ROOT [--models resnet50,vit_base_patch16_224]
        [--trainable head,all] [--images 8000] [--batch-size 256] [--epochs 3]
        [--device-batches 64] [--json OUT]

ROOT is written first if it holds no ``train/`` folder (``ef.datasets.synthetic_images``:
``--images`` JPEGs of 300-550 px sides in 10 classes, nine tenths for training). For each
model and each ``--trainable`` (``head``: the backbone frozen, no optimizer state for it, its
BatchNorm in inference mode; ``all``: everything trains, the backbone at a tenth of the head's
rate), each in a fresh interpreter:

* ``device``: ``Trainer.fit`` on ``--batch-size`` x ``--device-batches`` random images held in device memory
  (``cache=True``, so the later epochs read no input): fit's train step with nothing to wait
  for, the most the model allows through fit;
* ``stream``: ``Trainer.fit`` on ``ROOT/train`` with random resized crops of 224 px, flips and
  ImageNet normalisation, ``cache=False``.

Both bfloat16 with Adam; the weights are random (speed does not depend on their values).
images/s: training images per second, the median of the epochs after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from children import USER_ENV, epoch_timer, last_json

HERE = Path(__file__).resolve().parent


def child(args: argparse.Namespace) -> None:
    import jax
    import numpy as np
    import optax

    import easyfit as ef

    if args.where == "device":
        n = args.batch_size * args.device_batches
        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, (n, 224, 224, 3), dtype=np.uint8)
        y = rng.integers(0, 10, n)
        train = ef.data.Arrays(x, y, scale=1 / 255)
        cache: bool = True
    else:
        aug = ef.data.Augment(random_resized_crop=(0.08, 1.0), flip=True)
        train = ef.data.ImageFolder(
            os.path.join(args.root, "train"), image_size=(224, 224), augment=aug, normalize="imagenet"
        )
        cache = False
    model = ef.models.create_model(args.model, 10)
    head = "^fc/" if hasattr(model, "fc") else "^head/"
    if args.mode == "head":
        tx = ef.models.trainable(model, optax.adam(1e-3), "head")
    else:
        tx = ef.models.trainable(model, optax.adam(1e-4), "all", groups={head: optax.adam(1e-3)})
    trainer = ef.Trainer(model, optimizer=tx, precision="bfloat16", seed=0)
    seconds, timer = epoch_timer(ef)
    started = time.perf_counter()
    trainer.fit(
        train, epochs=args.epochs, batch_size=args.batch_size, cache=cache, callbacks=[timer], verbose=0
    )
    rates = [len(train) / s for s in seconds]
    print(
        json.dumps(
            {
                "images_per_s": round(statistics.median(rates[1:] or rates)),
                "first_epoch_s": round(seconds[0], 2),
                "total_s": round(time.perf_counter() - started, 1),
                "device": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--models", default="resnet50,vit_base_patch16_224")
    ap.add_argument("--trainable", default="head,all")
    ap.add_argument("--images", type=int, default=8000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--device-batches", type=int, default=64, help="batches of the on-device run")
    ap.add_argument("--json", default=None)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--where", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.where:
        child(args)
        return
    if not os.path.isdir(os.path.join(args.root, "train")):
        import easyfit as ef

        per_class = round(args.images * 0.9 / 10)
        ef.datasets.synthetic_images(
            args.root, classes=10, per_class=(per_class, args.images // 10 - per_class), size=(300, 550)
        )
    import subprocess

    rows = []
    for model in args.models.split(","):
        for mode in args.trainable.split(","):
            row: dict = {"model": model, "trainable": mode}
            for where in ("device", "stream"):
                cmd = [sys.executable, __file__, *sys.argv[1:], "--model", model, "--mode", mode]
                proc = subprocess.run(cmd + ["--where", where], capture_output=True, text=True, env=USER_ENV)
                row[where] = last_json(proc, f"{model} {mode} {where}")
            row["stream_vs_device"] = round(row["stream"]["images_per_s"] / row["device"]["images_per_s"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("| model | trainable | on the device (img/s) | streamed (img/s) | streamed / device |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['model']} | {r['trainable']} | {r['device']['images_per_s']:,} | "
            f"{r['stream']['images_per_s']:,} | {r['stream_vs_device']:.2f} |"
        )
    if args.json:
        results = {"command": " ".join(["python", *sys.argv]), "rows": rows}
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
