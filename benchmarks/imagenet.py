"""ImageNet-shaped speed: the model alone, the input alone, the hand-written loop and easyfit's
fit, in one run, on the same generated folder.

    python benchmarks/imagenet.py ROOT [--images 28000] [--epochs 3] [--batch-size 256]
        [--parts model,pipeline,loop,fit] [--models resnet18,resnet50] [--json OUT.json]

ROOT is written first if it holds no ``train/`` folder: ``--images`` JPEGs of 300-550 px sides,
about 90 KiB each at quality 90, in 10 classes, nine tenths for training
(``ef.datasets.synthetic_images``; needs Pillow). Each part runs in a process of its own:

* ``model``: the train step alone, on one batch held on the devices (the compute limit; with
  several GPUs visible, the batch split over them as in ``fit``);
* ``pipeline``: DALI alone, the training pipeline of the recipe (decode into a random crop,
  resize, flip, normalise) with ``hw_decoder_load`` and thread counts swept (the input limit);
* ``loader``: easyfit's loader alone;
* ``overlap``: the input (DALI alone, then easyfit's loader) in a thread while the main thread
  trains on a batch held on the device, with at most 1, 4 or 16 steps queued: what each side
  gets when both share the GPU;
* ``chunk``: the train step as fit dispatches it (k steps in one ``lax.scan``, with the
  per-step ``lax.cond`` that skips padding steps, or a select) against one step per dispatch,
  on batches held on the GPU, alone and beside easyfit's loader;
* ``loop``: the hand-written loop as DALI's documentation writes it: ``fn.readers.file``, mixed
  decode, the ``nvidia.dali.plugin.jax`` iterator, a jitted step, DALI's default settings;
* ``fit``: ``Trainer.fit`` with the recipe of ``examples/imagenet_resnet.py``.

All in bfloat16, global batch ``--batch-size``; images/s are training images per second over the
epochs after the first (median), and the first epoch's seconds include compilation.
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

from imagenet_recipe import MEAN, STD, example, model_step, recipe_source, train_pipeline
from imagenet_sharing import part_chunk, part_overlap

HERE = Path(__file__).resolve().parent
#: The environment as the user gave it, for every part's process: importing easyfit here (to
#: write the folder) sets its CUDA settings, which the hand-written loop must not inherit.
USER_ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def part_model(args) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(jax.devices(), ("data",))  # the global batch split over every visible GPU
    rows, everywhere = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    out = {}
    for name in args.models.split(","):
        state, step, _ = model_step(name, 10, args.batch_size)
        state = jax.device_put(state, everywhere)
        x = jax.random.normal(jax.random.PRNGKey(1), (args.batch_size, 224, 224, 3), jnp.float16)
        x, y = jax.device_put((x, jnp.zeros((args.batch_size,), jnp.int32)), rows)
        for _ in range(5):
            state, loss, _ = step(state, x, y)
        loss.block_until_ready()
        n, t = 50, time.perf_counter()
        for _ in range(n):
            state, loss, _ = step(state, x, y)
        loss.block_until_ready()
        out[name] = round(n * args.batch_size / (time.perf_counter() - t))
    return out


def part_pipeline(args) -> dict:
    device_id = None if args.cpu else 0
    results = {}
    loads = [None] if args.cpu else [0.65, 0.9, 1.0]
    for threads in [2] if args.cpu else [8, 16]:
        for load in loads:
            pipe = train_pipeline(os.path.join(args.root, "train"), args.batch_size, threads, device_id, load)
            pipe.build()
            for _ in range(5):
                pipe.run()
            n, t = 0, time.perf_counter()
            while time.perf_counter() - t < args.seconds:
                pipe.run()
                n += args.batch_size
            results[f"threads={threads} hw_decoder_load={load}"] = round(n / (time.perf_counter() - t))
            del pipe
    best = max(results, key=results.get)
    return {"sweep": results, "best": best, "best_images_per_s": results[best]}


def part_loader(args) -> dict:
    """easyfit's input side alone: its Loader for the recipe's training source, no model."""
    import jax

    import easyfit as ef
    from easyfit.data import Loader
    from easyfit.parallel import Placement

    train = recipe_source(args)
    placement = Placement.create()
    batch = args.batch_size * placement.num_shards
    plan = ef.data.Plan(
        len(train),
        batch,
        shuffle=True,
        seed=0,
        steps_per_execution=max(1, 6000 // batch),
        num_shards=placement.num_shards,
    )
    loader = Loader(train, plan, placement, training=True)
    rows = plan.batch_size * plan.steps_per_execution
    for _ in range(2):
        jax.block_until_ready(next(loader)["x"])
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < 2 * args.seconds:
        jax.block_until_ready(next(loader)["x"])
        n += rows
    loader.close()
    return {"images_per_s": round(n / (time.perf_counter() - t)), "rows_per_chunk": rows}


def part_loop(args) -> dict:
    """The hand-written loop, DALI's defaults (num_threads as in DALI's examples: 4)."""
    import jax
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.jax import DALIGenericIterator

    device_id = None if args.cpu else 0
    train = train_pipeline(os.path.join(args.root, "train"), args.batch_size, 4, device_id, None)
    it = DALIGenericIterator([train], ["images", "labels"], reader_name="reader", auto_reset=True)

    @pipeline_def(batch_size=args.batch_size, num_threads=4, device_id=device_id, seed=0)
    def val_pipe():
        jpegs, labels = fn.readers.file(
            file_root=os.path.join(args.root, "val"), name="reader", pad_last_batch=True
        )
        images = fn.decoders.image(
            jpegs, device="mixed" if device_id is not None else "cpu", output_type=types.RGB
        )
        images = fn.resize(images, resize_shorter=256)
        images = fn.crop_mirror_normalize(
            images, crop=(224, 224), mean=MEAN, std=STD, dtype=types.FLOAT16, output_layout="HWC"
        )
        return images, labels.gpu() if device_id is not None else labels

    val = DALIGenericIterator([val_pipe()], ["images", "labels"], reader_name="reader", auto_reset=True)
    n_val = sum(len(f) for _, _, f in os.walk(os.path.join(args.root, "val")))
    n_train = sum(len(f) for _, _, f in os.walk(os.path.join(args.root, "train")))
    state, step, correct = model_step(args.models.split(",")[0], 10, args.batch_size)
    seconds, start = [], time.perf_counter()
    for _ in range(args.epochs):
        t, loss = time.perf_counter(), None
        for batch in it:
            state, loss, _ = step(state, batch["images"], batch["labels"].reshape(-1))
        loss.block_until_ready()
        seconds.append(time.perf_counter() - t)
    right, seen = 0, 0
    for batch in val:  # the last batch is padded: count each sample once
        x, y = batch["images"], batch["labels"].reshape(-1)
        take = min(len(y), n_val - seen)
        right, seen = right + int(correct(state, x[:take], y[:take])), seen + take
    rates = [n_train / s for s in seconds]
    return {
        "images_per_s": round(statistics.median(rates[1:] or rates)),
        "first_epoch_s": round(seconds[0], 2),
        "total_s": round(time.perf_counter() - start, 1),
        "val_accuracy": round(right / seen, 4),
        "devices": jax.device_count(),
    }


def part_fit(args) -> dict:
    import easyfit as ef

    if args.coordinator:  # one process per GPU: this one sees its own GPU only
        ef.distributed.initialize(args.coordinator, args.processes, args.process_id)
    import jax
    import numpy as np

    sys.path.insert(0, str(HERE))
    from run_easyfit import EpochTimer

    ex = example()
    if args.hw_load is not None:
        ef.data.images.HW_DECODER_LOAD = args.hw_load
    out = {}
    for name in args.models.split(","):
        start = time.perf_counter()
        train = recipe_source(args)
        model = {"resnet18": ex.resnet18, "resnet50": ex.resnet50}[name](len(train.class_names))
        steps = -(-len(train) // args.batch_size)
        trainer = ef.Trainer(
            model,
            optimizer=ex.optimizer(args.batch_size, steps, args.epochs),
            loss=ex.smoothed_cross_entropy,
            metrics=["accuracy"],
            precision="bfloat16",
            seed=0,
            num_threads=args.threads,
            pipelines_per_device=args.pipelines,
            steps_per_execution=args.spe,
        )
        timer = EpochTimer()
        history = trainer.fit(
            train,
            validation_data=os.path.join(args.root, "val"),
            epochs=args.epochs,
            batch_size=args.batch_size,
            callbacks=[timer],
            verbose=2,
        )
        rates = [len(train) / s for s in timer.seconds]
        leaves = jax.tree_util.tree_leaves(trainer.state)
        identical = all(
            np.array_equal(np.asarray(s.data), np.asarray(leaf.addressable_shards[0].data))
            for leaf in leaves
            for s in leaf.addressable_shards
        )
        out[name] = {
            "images_per_s": round(statistics.median(rates[1:] or rates)),
            "first_epoch_s": round(timer.seconds[0], 2),
            "total_s": round(time.perf_counter() - start, 1),
            "val_accuracy": round(history.history["val_accuracy"][-1], 4),
            "input_wait": history.history.get("input_wait", [None])[-1],
            "devices": jax.device_count(),
            "processes": jax.process_count(),
            "replicas_identical": identical,
            "batch_size": args.batch_size,
            "threads": args.threads,
            "pipelines": args.pipelines,
        }
    return out


def launch(cmd: list[str], n: int) -> subprocess.CompletedProcess:
    """``cmd`` as n processes, one per GPU and an equal share of the cores; process 0's
    output."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cores = sorted(os.sched_getaffinity(0))
    share = len(cores) // n
    procs = []
    for i in range(n):
        mine = ",".join(map(str, cores[i * share : (i + 1) * share]))
        env = {**USER_ENV, "CUDA_VISIBLE_DEVICES": str(i)}
        procs.append(
            subprocess.Popen(
                ["taskset", "-c", mine, *cmd, "--process-id", str(i), "--coordinator", f"localhost:{port}"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate() for p in procs]
    code = max(p.returncode for p in procs)
    return subprocess.CompletedProcess(cmd, code, outs[0][0], "".join(o[1] for o in outs))


PARTS = {
    "model": part_model,
    "pipeline": part_pipeline,
    "loader": part_loader,
    "overlap": part_overlap,
    "chunk": part_chunk,
    "loop": part_loop,
    "fit": part_fit,
}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("root")
    ap.add_argument("--images", type=int, default=28000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--parts", default="model,pipeline,loader,loop,fit")
    ap.add_argument("--models", default="resnet18,resnet50")
    ap.add_argument("--seconds", type=float, default=6.0, help="per pipeline setting")
    ap.add_argument("--cpu", action="store_true", help="a smoke run without a GPU")
    ap.add_argument(
        "--hw-load", type=float, default=None, help="fit: easyfit's hw_decoder_load (default: easyfit's own)"
    )
    ap.add_argument("--threads", type=int, default=None, help="fit: DALI threads per pipeline")
    ap.add_argument("--pipelines", type=int, default=None, help="fit: DALI pipelines per GPU")
    ap.add_argument(
        "--processes", type=int, default=1, help="fit: one process per GPU (ef.distributed) when > 1"
    )
    ap.add_argument(
        "--spe", default="auto", type=lambda v: v if v == "auto" else int(v), help="fit: steps_per_execution"
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--process-id", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part:
        print(json.dumps(PARTS[args.part](args)), flush=True)
        return
    if not os.path.isdir(os.path.join(args.root, "train")):
        import easyfit as ef

        t = time.perf_counter()
        per_class = round(args.images * 0.9 / 10)
        ef.datasets.synthetic_images(
            args.root, classes=10, per_class=(per_class, args.images // 10 - per_class)
        )
        print(f"wrote {args.images} images in {time.perf_counter() - t:.0f} s", flush=True)
    results = {}
    for part in args.parts.split(","):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--part", part]
        if part == "fit" and args.processes > 1:
            proc = launch(cmd, args.processes)
        else:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=USER_ENV)
        print(proc.stdout[-4000:], proc.stderr[-3000:] if proc.returncode else "", flush=True)
        results[part] = (
            json.loads(proc.stdout.strip().splitlines()[-1])
            if proc.returncode == 0
            else {"error": proc.returncode}
        )
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
