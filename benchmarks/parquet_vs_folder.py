"""Parquet shards against a folder of the same JPEGs: fit's streaming speed on each, in one run.

    python benchmarks/parquet_vs_folder.py ROOT [--images 12800] [--epochs 5] [--batch-size 256]
        [--model resnet18] [--shards 8] [--row-group 256] [--json OUT]

ROOT gets ``ROOT/folder``, an ImageNet-shaped folder (``ef.datasets.synthetic_images``:
``--images`` JPEGs of ``--sides`` pixels in 10 classes, nine tenths for training), and
``ROOT/parquet/data/train-0000k-of-0000n.parquet``: the same training JPEGs, byte for byte, in
``--shards`` shards of Hugging Face's layout (an ``image`` column of ``{"bytes", "path"}``
structs, an int ``label`` column, the class names in the schema's ``huggingface`` metadata,
row groups of ``--row-group`` rows), unless they are there already. Then, each in a fresh
interpreter, ``Trainer.fit(..., cache=False)`` streams each for ``--epochs`` epochs with the
same model, recipe (random resized crop, flip, ImageNet normalisation, bfloat16) and batch:
``ef.data.ImageFolder(ROOT/folder/train)`` and ``ef.data.Parquet(ROOT/parquet/data/train-*)``.
It prints images/s (median over the epochs after the first) of each and their ratio.
``--model tiny`` (one strided convolution and a dense layer) makes the model cheap, so that the
input side is what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from children import epoch_timer, last_json, run_again

HERE = Path(__file__).resolve().parent


def write_parquet(folder: str, out: str, shards: int, row_group: int) -> None:
    """The JPEGs of ``folder/<class>/*`` as ``out/data/train-*.parquet``, in the folder's order
    (classes sorted, files sorted)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    files = [
        (os.path.join(folder, c, f), k)
        for k, c in enumerate(names)
        for f in sorted(os.listdir(os.path.join(folder, c)))
    ]
    os.makedirs(os.path.join(out, "data"), exist_ok=True)
    features = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}
    meta = {"huggingface": json.dumps({"info": {"features": features}})}
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    per = -(-len(files) // shards)
    for s in range(shards):
        part = files[s * per : (s + 1) * per]
        images = [{"bytes": Path(p).read_bytes(), "path": os.path.basename(p)} for p, _ in part]
        table = pa.table(
            {"image": pa.array(images, kind), "label": pa.array([k for _, k in part], pa.int64())}
        )
        table = table.replace_schema_metadata(meta)
        pq.write_table(
            table,
            os.path.join(out, "data", f"train-{s:05d}-of-{shards:05d}.parquet"),
            row_group_size=row_group,
        )


def child(args) -> None:
    """One streaming fit of ``args.source``; prints one JSON line."""
    sys.path.insert(0, str(HERE))
    from flax import linen as nn
    from imagenet_recipe import example

    import easyfit as ef

    ex = example()
    side = (args.image_size, args.image_size)
    aug = ef.data.Augment(random_resized_crop=(0.08, 1.0), flip=True)
    if args.source == "folder":
        train = ef.data.ImageFolder(
            os.path.join(args.root, "folder", "train"), image_size=side, augment=aug, normalize="imagenet"
        )
    else:
        train = ef.data.Parquet(
            os.path.join(args.root, "parquet", "data", "train-*.parquet"),
            image_size=side,
            augment=aug,
            normalize="imagenet",
        )
    classes = len(train.class_names)
    if args.model == "tiny":

        class Tiny(nn.Module):
            @nn.compact
            def __call__(self, x, train: bool = False):
                x = nn.relu(nn.Conv(32, (4, 4), strides=(4, 4))(x))
                return nn.Dense(classes)(x.mean(axis=(1, 2)))

        model = Tiny()
    else:
        model = {"resnet18": ex.resnet18, "resnet50": ex.resnet50}[args.model](classes)
    trainer = ef.Trainer(
        model,
        optimizer=ex.optimizer(args.batch_size, 100, args.epochs),
        loss=ex.smoothed_cross_entropy,
        metrics=["accuracy"],
        precision="bfloat16",
        seed=0,
    )
    seconds, timer = epoch_timer(ef)
    history = trainer.fit(
        train,
        epochs=args.epochs,
        batch_size=args.batch_size,
        cache=False,
        verbose=0,
        callbacks=[timer],
    )
    rates = [len(train) / s for s in seconds]
    print(
        json.dumps(
            {
                "images": len(train),
                "epoch_seconds": [round(s, 3) for s in seconds],
                "images_per_s": round(statistics.median(rates[1:] or rates)),
                "input_wait": history.history.get("input_wait"),
                "accuracy": history.history["accuracy"][-1],
                "loss": history.history["loss"][-1],
            }
        ),
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("root")
    ap.add_argument("--images", type=int, default=12_800, help="JPEGs to write (train + val)")
    ap.add_argument("--sides", default="300,550", help="the JPEGs' smallest and largest side")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--model", choices=["tiny", "resnet18", "resnet50"], default="resnet18")
    ap.add_argument("--image-size", type=int, default=224, help="the crops' side")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--row-group", type=int, default=256, help="rows per Parquet row group")
    ap.add_argument("--json", default=None)
    ap.add_argument("--source", choices=["folder", "parquet"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.source:
        child(args)
        return
    folder, parquet = os.path.join(args.root, "folder"), os.path.join(args.root, "parquet")
    if not os.path.isdir(os.path.join(folder, "train")):
        import easyfit as ef  # in this process only: the runs start from children.USER_ENV

        t = time.perf_counter()
        per_class = round(args.images * 0.9 / 10)
        lo, hi = (int(v) for v in args.sides.split(","))
        ef.datasets.synthetic_images(
            folder, classes=10, per_class=(per_class, args.images // 10 - per_class), size=(lo, hi)
        )
        print(f"wrote {args.images:,} JPEGs in {time.perf_counter() - t:.0f} s", flush=True)
    if not os.path.isdir(os.path.join(parquet, "data")):
        t = time.perf_counter()
        write_parquet(os.path.join(folder, "train"), parquet, args.shards, args.row_group)
        print(f"wrote {args.shards} Parquet shards in {time.perf_counter() - t:.0f} s", flush=True)
    results = {}
    for source in ("folder", "parquet"):
        results[source] = last_json(run_again(__file__, "--source", source), f"the {source} run")
        print(f"{source}: {json.dumps(results[source])}", flush=True)
    ratio = results["parquet"]["images_per_s"] / results["folder"]["images_per_s"]
    results["parquet_over_folder"] = round(ratio, 4)
    print(
        f"\n{args.model}, {args.image_size}x{args.image_size} random resized crops, bfloat16, batch "
        f"{args.batch_size}, cache=False, {args.epochs} epochs of {results['folder']['images']:,} JPEGs"
    )
    print("| source | steady images/s | first epoch (s) |")
    print("| --- | ---: | ---: |")
    for source in ("folder", "parquet"):
        r = results[source]
        print(f"| {source} | {r['images_per_s']:,} | {r['epoch_seconds'][0]:.2f} |")
    print(f"\nParquet streams at {ratio:.3f}x the folder's speed")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
