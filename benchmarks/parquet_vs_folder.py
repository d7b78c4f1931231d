"""Parquet shards against a folder of the same JPEGs: fit's streaming speed on each, in one run.

    python benchmarks/parquet_vs_folder.py ROOT [--make 10000] [--model tiny resnet18]
        [--repeat 3] [--epochs 5] [--batch-size 256] [--shards 8] [--row-group 256]
        [--small-cache 0.25] [--out results.json]

ROOT gets ``ROOT/folder``, an ImageNet-shaped folder (``ef.datasets.synthetic_images``:
``--make`` JPEGs of ``--sides`` pixels, about 90 KiB each, in 10 classes, nine tenths for
training), and ``ROOT/parquet/data/train-0000k-of-0000n.parquet``: the same training JPEGs,
byte for byte, in ``--shards`` shards of Hugging Face's layout (an ``image`` column of
``{"bytes", "path"}`` structs, an int ``label`` column, the class names in the schema's
``huggingface`` metadata, row groups of ``--row-group`` rows, snappy as pyarrow writes by
default), unless they are there already.

Then, for each ``--model``, each run in a fresh interpreter, ``Trainer.fit(..., cache=False)``
streams ``--epochs`` epochs with the same model, recipe (random resized crop, flip, ImageNet
normalisation, bfloat16) and batch, ``--repeat`` times alternating
``ef.data.ImageFolder(ROOT/folder/train)`` and ``ef.data.Parquet(ROOT/parquet/data/train-*)``;
then once Parquet with ``cache_bytes`` at ``--small-cache`` of the shards' size (or
``--cache-bytes`` bytes), two epochs at most and stopped after ``--small-cache-timeout``
seconds: a shuffled pass then reads windows of row groups, each once per pass
(``ef.data.Parquet(shuffle="auto")``; ``--small-cache-shuffle global`` measures a permutation of
all the rows instead, which reads row groups again and again); its row group reads per pass
are reported; ``--small-cache 0`` leaves it out).
It prints, per model and source, the medians over the runs of images/s (each run's median of
its steady epochs: after the first two, where there are four or more, since the second epoch
of a source read ahead can be mostly read already) and of the first epoch's seconds, a markdown
table, and writes every run's figures to ``--out`` (JSON). ``--model tiny`` (one strided
convolution and a dense layer) makes the model cheap, so that the input side is what is measured.

At the defaults (10,000 JPEGs, tiny and resnet18, three repeats, five epochs) it takes about
six to eight minutes on one H200 with 16 cores, data written included.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from children import USER_ENV, epoch_timer

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
            cache_bytes=args.child_cache,
            shuffle=args.small_cache_shuffle if args.child_cache is not None else "auto",
        )
    classes = len(train.class_names)
    if args.child_model == "tiny":

        class Tiny(nn.Module):
            @nn.compact
            def __call__(self, x, train: bool = False):
                x = nn.relu(nn.Conv(32, (4, 4), strides=(4, 4))(x))
                return nn.Dense(classes)(x.mean(axis=(1, 2)))

        model = Tiny()
    else:
        model = {"resnet18": ex.resnet18, "resnet50": ex.resnet50}[args.child_model](classes)
    trainer = ef.Trainer(
        model,
        optimizer=ex.optimizer(args.batch_size, 100, args.child_epochs),
        loss=ex.smoothed_cross_entropy,
        metrics=["accuracy"],
        precision="bfloat16",
        seed=0,
    )
    seconds, timer = epoch_timer(ef)
    history = trainer.fit(
        train,
        epochs=args.child_epochs,
        batch_size=args.batch_size,
        cache=False,
        verbose=0,
        callbacks=[timer],
    )
    rates = [len(train) / s for s in seconds]
    steady = rates[2:] if len(rates) >= 4 else rates[1:] or rates
    print(
        json.dumps(
            {
                "images": len(train),
                "epoch_seconds": [round(s, 3) for s in seconds],
                "images_per_s": round(statistics.median(steady)),
                "input_wait": history.history.get("input_wait"),
                "accuracy": history.history["accuracy"][-1],
                "loss": history.history["loss"][-1],
                # reads of row groups from the files per pass (1.0: each once; Parquet only)
                "row_group_reads_per_pass": (
                    round(float(train._groups.reads.sum()) / len(train._groups.reads) / len(seconds), 2)
                    if args.source == "parquet"
                    else None
                ),
                "machine": machine(),
            }
        ),
        flush=True,
    )


def machine() -> dict:
    """What a run measured on: cores, devices, versions (in a child: the parent never starts
    JAX, which would hold the GPU's memory)."""
    import platform

    import jax
    import nvidia.dali
    import pyarrow

    devices = jax.devices()
    return {
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "device": f"{len(devices)} x {devices[0].device_kind}",
        "python": platform.python_version(),
        "jax": jax.__version__,
        "dali": nvidia.dali.__version__,
        "pyarrow": pyarrow.__version__,
    }


def run(args, source: str, model: str, epochs: int, cache_bytes: int | None, timeout: float | None) -> dict:
    """One fit in a fresh interpreter: its JSON line (``{"error": ...}`` when it failed or ran
    past ``timeout`` seconds)."""
    extra = ["--source", source, "--child-model", model, "--child-epochs", str(epochs)]
    if cache_bytes is not None:
        extra += ["--child-cache", str(cache_bytes)]
    cmd = [sys.executable, __file__, *sys.argv[1:], *extra]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=USER_ENV, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past {timeout:.0f} s"}
    if proc.returncode != 0:
        print(f"{source} {model} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
        return {"error": f"rc {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] if key != "first_epoch_s" else r["epoch_seconds"][0] for r in runs if "error" not in r]
    return statistics.median(values) if values else None


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("root")
    ap.add_argument(
        "--make", "--images", dest="images", type=int, default=10_000, help="JPEGs to write (train + val)"
    )
    ap.add_argument("--sides", default="300,550", help="the JPEGs' smallest and largest side")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument(
        "--model", nargs="+", choices=["tiny", "resnet18", "resnet50"], default=["tiny", "resnet18"]
    )
    ap.add_argument("--repeat", type=int, default=3, help="alternating folder / Parquet runs per model")
    ap.add_argument(
        "--small-cache",
        type=float,
        default=0.25,
        help="cache_bytes of one more Parquet run, as a fraction of the shards' size (0: no such run)",
    )
    ap.add_argument(
        "--cache-bytes",
        type=int,
        default=None,
        help="that run's cache_bytes in bytes (instead of --small-cache)",
    )
    ap.add_argument("--small-cache-timeout", type=float, default=75, help="seconds that run may take")
    ap.add_argument(
        "--small-cache-shuffle",
        choices=["auto", "global", "row_groups"],
        default="auto",
        help="that run's ef.data.Parquet(shuffle=)",
    )
    ap.add_argument("--image-size", type=int, default=224, help="the crops' side")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--row-group", type=int, default=256, help="rows per Parquet row group")
    ap.add_argument("--out", "--json", dest="out", default=None, help="where to write the JSON results")
    ap.add_argument("--source", choices=["folder", "parquet"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-epochs", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-cache", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.source:
        child(args)
        return
    started = time.perf_counter()
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
    shards = [os.path.join(parquet, "data", f) for f in sorted(os.listdir(os.path.join(parquet, "data")))]
    shard_bytes = sum(os.path.getsize(f) for f in shards)
    small = args.cache_bytes or (int(shard_bytes * args.small_cache) if args.small_cache > 0 else None)
    results: dict = {"command": " ".join(["python", *sys.argv])}
    results["shard_bytes"] = shard_bytes
    rows = []
    for model in args.model:
        runs: dict[str, list[dict]] = {"folder": [], "parquet": []}
        for k in range(args.repeat):
            for source in ("folder", "parquet") if k % 2 == 0 else ("parquet", "folder"):
                r = run(args, source, model, args.epochs, None, None)
                runs[source].append(r)
                print(f"{model} {source} run {k + 1}: {json.dumps(r)}", flush=True)
        if small is not None:
            epochs = min(args.epochs, 2)  # with shuffle="global", row groups read again and again
            r = run(args, "parquet", model, epochs, small, args.small_cache_timeout)
            runs[f"parquet, cache_bytes {small / 2**20:,.1f} MiB"] = [r]
            print(f"{model} parquet cache_bytes={small}: {json.dumps(r)}", flush=True)
        folder_rate = median_of(runs["folder"], "images_per_s")
        folder_first = median_of(runs["folder"], "first_epoch_s")
        for source, these in runs.items():
            rate, first = median_of(these, "images_per_s"), median_of(these, "first_epoch_s")
            rows.append(
                {
                    "model": model,
                    "source": source,
                    "runs": len(these),
                    "images_per_s": rate,
                    "first_epoch_s": first,
                    "speed_vs_folder": rate / folder_rate if rate and folder_rate else None,
                    "first_epoch_vs_folder": first / folder_first if first and folder_first else None,
                    "errors": [r["error"] for r in these if "error" in r],
                }
            )
        results[model] = runs
    results["table"] = rows
    results["machine"] = next(
        (r["machine"] for m in args.model for rs in results[m].values() for r in rs if "machine" in r), {}
    )
    images = next((r["images"] for m in args.model for r in results[m]["folder"] if "images" in r), 0)
    m = {"device": "?", "cores": "?", "jax": "?", "dali": "?", "pyarrow": "?", **results["machine"]}
    print(
        f"\n{m['device']}, {m['cores']} cores, JAX {m['jax']}, DALI {m['dali']}, pyarrow {m['pyarrow']}; "
        f"{args.image_size}x{args.image_size} random resized crops, bfloat16, batch {args.batch_size}, "
        f"cache=False, {args.epochs} epochs of {images:,} JPEGs; medians of {args.repeat} alternating runs"
    )
    print("| model | source | runs | images/s | x folder | first epoch (s) | x folder |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:

        def fmt(v, spec):
            return format(v, spec) if v is not None else "-"

        print(
            f"| {r['model']} | {r['source']} | {r['runs']} | {fmt(r['images_per_s'], ',.0f')} | "
            f"{fmt(r['speed_vs_folder'], '.3f')} | {fmt(r['first_epoch_s'], '.2f')} | "
            f"{fmt(r['first_epoch_vs_folder'], '.2f')} |" + (f" {r['errors']}" if r["errors"] else "")
        )
    print(f"\n(took {time.perf_counter() - started:.0f} s)")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
