"""Seconds from a process's start to its first training step, imports included, and the host
memory (RSS) at that point: easyfit cold and warm against a hand-written DALI + Flax loop.

    python benchmarks/startup.py FOLDER [--files 50000] [--classes 100] [--imagenet]
        [--batch-size 256] [--size 16] [--json ROWS_JSON]
    python benchmarks/startup.py FOLDER --recipe resnet50 [--images 25600] [--batch-size 256]
        [--json ROWS_JSON]

FOLDER gets an ImageNet-shaped image folder (``train/<class>/*.jpg`` and ``val/<class>/*.jpg``)
of tiny JPEGs, so that decoding does not dominate, unless it holds one this script wrote with
the same arguments. ``--imagenet`` writes ImageNet's size: 1,281,167 training and 51,246
validation files in 1,000 classes. Three runs, each in a fresh interpreter, one after the
other:

* the hand-written loop: ``fn.readers.file`` over the training and validation folders, a CPU
  (or, on a GPU, mixed) decoder, ``nvidia.dali.plugin.jax``'s iterator and a jitted Flax step;
* easyfit, cold: ``Trainer.fit(FOLDER)`` with an empty compilation cache;
* easyfit, warm: the same again, reading the cache the cold run wrote.

The model (one convolution, global average pooling, a dense layer) and the optimizer are the
same for both. The clock starts just before the interpreter is started and stops once the
first step's loss is on the host (for easyfit: at the end of the first dispatch, which is one
step on a CPU and ``steps_per_execution`` steps on a GPU). Each run prints one JSON line; this
script prints a markdown table of them (and writes them to ``--json``).

``--recipe resnet50`` times the ResNet-50 recipe instead (benchmarks/imagenet_recipe.py: random
resized crop, flip, ImageNet normalisation, bfloat16) on a folder of real-sized JPEGs
(``ef.datasets.synthetic_images``: ``--images`` of 300-550 px sides in 10 classes, nine tenths
for training): the loop is ``train_pipeline`` + ``model_step``, easyfit is ``Trainer.fit`` with
``examples/imagenet_resnet.py``'s model, optimizer and loss on ``recipe_source``. Both train on
``train/`` only (no validation). ``--model``, ``--width`` and ``--image-size`` shrink it for a
smoke run on a CPU. easyfit's first step is the end of its first dispatch
(``steps_per_execution`` steps: the table's note says how many; ``--spe 1`` for one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMAGENET = (1_281_167, 51_246, 1000)
REPO = Path(__file__).resolve().parents[1]
_STAMP = "STARTUP_FOLDER.json"
#: Compilation-cache settings the children do not inherit: each row starts from its own cache.
_CACHE_SETTINGS = ("EASYFIT_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR", "JAX_COMPILATION_CACHE_MAX_SIZE")
_T0 = "STARTUP_T0"  # the time.time() at which the parent started the child
#: The environment as the user gave it, before importing easyfit here (to write a folder) sets
#: its own settings, which the hand-written loop must not inherit.
USER_ENV = dict(os.environ)


def write_folder(root: Path, train: int, val: int, classes: int, size: int) -> None:
    """``root/{train,val}/<class>/<n>.jpg``: one tiny JPEG per class (its own colour), written
    again for every file of the class, files dealt round-robin to the classes."""
    import numpy as np

    sys.path.insert(0, str(REPO))  # tests/helpers
    from tests.helpers.formats import encode

    stamp = {"train": train, "val": val, "classes": classes, "size": size}
    if (root / _STAMP).is_file() and json.loads((root / _STAMP).read_text()) == stamp:
        return
    if root.exists() and any(root.iterdir()):
        raise SystemExit(f"{root}: not empty and not a folder this script wrote with these arguments")
    rng = np.random.default_rng(0)
    jpegs = [
        encode(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), "jpeg", quality=90)
        for _ in range(classes)
    ]
    for split, count in (("train", train), ("val", val)):
        for c in range(classes):
            os.makedirs(root / split / f"n{c:08d}", exist_ok=True)
        for i in range(count):
            c = i % classes
            with open(root / split / f"n{c:08d}" / f"{i:08d}.jpg", "wb") as f:
                f.write(jpegs[c])
    (root / _STAMP).write_text(json.dumps(stamp))


def _rss_mib() -> float:
    """This process's resident memory now, in MiB (Linux: /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _report(t0: float, **extra) -> None:
    print(json.dumps({"first_step_s": round(time.time() - t0, 3), "rss_mib": round(_rss_mib(), 1), **extra}))
    sys.stdout.flush()
    os._exit(0)  # the measurement is taken: nothing after the first step is timed or waited for


def _model(classes: int):
    from flax import linen as nn

    class Small(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            x = nn.relu(nn.Conv(16, (3, 3))(x))
            return nn.Dense(classes)(x.mean(axis=(1, 2)))

    return Small()


def child_easyfit(root: str, batch: int, classes: int, t0: float) -> None:
    import jax
    import optax

    import easyfit as ef

    hits: list[str] = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
    )
    trainer = ef.Trainer(_model(classes), optimizer=optax.sgd(0.1, momentum=0.9), seed=0)

    def first(batch_index, logs):
        float(logs["loss"])  # on the host: the step has run
        _report(t0, cache_hits=len(hits))

    trainer.fit(
        root,
        epochs=1,
        batch_size=batch,
        verbose=0,
        callbacks=[ef.callbacks.LambdaCallback(on_train_batch_end=first)],
    )


def child_loop(root: str, batch: int, classes: int, t0: float) -> None:
    import jax
    import jax.numpy as jnp
    import optax
    from flax.training import train_state
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.jax import DALIGenericIterator

    gpu = jax.default_backend() == "gpu"
    threads = max(1, (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2) // 2)

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if gpu else None, seed=0)
    def images(folder: str, shuffle: bool):
        jpegs, labels = fn.readers.file(file_root=folder, random_shuffle=shuffle, name="files")
        decoded = fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB)
        scaled = fn.crop_mirror_normalize(decoded, dtype=types.FLOAT, std=[255.0] * 3, output_layout="HWC")
        return scaled, labels.gpu() if gpu else labels

    train, _val = (
        DALIGenericIterator(images(os.path.join(root, s), s == "train"), ["x", "y"], reader_name="files")
        for s in ("train", "val")
    )
    model = _model(classes)
    first_batch = next(iter(train))
    params = model.init(jax.random.PRNGKey(0), first_batch["x"])["params"]
    state = train_state.TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.sgd(0.1, momentum=0.9)
    )

    @jax.jit
    def step(state, x, y):
        def loss(p):
            logits = state.apply_fn({"params": p}, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y.reshape(-1)).mean()

        value, grads = jax.value_and_grad(loss)(state.params)
        return state.apply_gradients(grads=grads), value

    state, value = step(state, first_batch["x"], jnp.asarray(first_batch["y"], jnp.int32))
    float(value)
    _report(t0)


def _recipe_sizes(args) -> tuple[int, int, int]:
    """(model width, image side, classes) of the recipe run."""
    return args.width, args.image_size, 10


def child_easyfit_recipe(root: str, args, t0: float) -> None:
    import jax

    import easyfit as ef

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from imagenet_recipe import example, recipe_source

    hits: list[str] = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
    )
    ex = example()
    width, side, _ = _recipe_sizes(args)
    train = recipe_source(argparse.Namespace(root=root, hw_load=None, image_size=side))
    model = {"resnet18": ex.resnet18, "resnet50": ex.resnet50}[args.model](len(train.class_names), width)
    steps = -(-len(train) // args.batch_size)
    trainer = ef.Trainer(
        model,
        optimizer=ex.optimizer(args.batch_size, steps, 90),
        loss=ex.smoothed_cross_entropy,
        metrics=["accuracy"],
        precision="bfloat16",
        seed=0,
        steps_per_execution=args.spe if args.spe == "auto" else int(args.spe),
    )

    def first(batch_index, logs):
        float(logs["loss"])  # on the host: the dispatch has run
        _report(t0, cache_hits=len(hits), steps_done=int(trainer.state.step))

    trainer.fit(
        train,
        epochs=1,
        batch_size=args.batch_size,
        verbose=0,
        callbacks=[ef.callbacks.LambdaCallback(on_train_batch_end=first)],
    )


def child_loop_recipe(root: str, args, t0: float) -> None:
    import jax
    from nvidia.dali.plugin.jax import DALIGenericIterator

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from imagenet_recipe import model_step, train_pipeline

    gpu = jax.default_backend() == "gpu"
    width, side, classes = _recipe_sizes(args)
    threads = 4  # as DALI's ResNet-50 examples
    pipe = train_pipeline(
        os.path.join(root, "train"), args.batch_size, threads, 0 if gpu else None, None, size=side
    )
    it = DALIGenericIterator([pipe], ["images", "labels"], reader_name="reader")
    state, step, _ = model_step(args.model, classes, args.batch_size, width=width, size=side)
    batch = next(iter(it))
    state, loss, _ = step(state, batch["images"], batch["labels"].reshape(-1))
    float(loss)
    _report(t0, steps_done=1)


def _run(kind: str, root: Path, args, env: dict) -> dict:
    argv = [sys.executable, __file__, str(root), "--child", kind, "--batch-size", str(args.batch_size)]
    argv += ["--classes", str(args.classes), "--recipe", args.recipe, "--model", args.model]
    argv += ["--width", str(args.width), "--image-size", str(args.image_size), "--spe", str(args.spe)]
    env = {**env, _T0: repr(time.time())}
    if kind == "loop":  # the recipe's loop imports easyfit (its model): keep easyfit's cache off
        env["EASYFIT_COMPILATION_CACHE"] = "0"
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} run failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--files", type=int, default=50_000, help="training files (default 50,000)")
    ap.add_argument("--val-files", type=int, default=None, help="validation files (default: files / 25)")
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument(
        "--imagenet", action="store_true", help="ImageNet's size: 1,281,167 + 51,246 files, 1,000 classes"
    )
    ap.add_argument("--size", type=int, default=16, help="image side in pixels (default 16)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument(
        "--recipe", choices=["tiny", "resnet50"], default="tiny", help="tiny JPEGs, or the ResNet-50 recipe"
    )
    ap.add_argument("--images", type=int, default=25_600, help="--recipe resnet50: JPEGs to write")
    ap.add_argument("--model", choices=["resnet50", "resnet18"], default="resnet50", help="--recipe resnet50")
    ap.add_argument("--width", type=int, default=64, help="--recipe resnet50: the ResNet's width")
    ap.add_argument("--image-size", type=int, default=224, help="--recipe resnet50: the crops' side")
    ap.add_argument("--spe", default="auto", help="--recipe resnet50: easyfit's steps_per_execution")
    ap.add_argument("--child", choices=["easyfit", "loop"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        t0 = float(os.environ[_T0])
        if args.recipe == "resnet50":
            recipe = child_easyfit_recipe if args.child == "easyfit" else child_loop_recipe
            recipe(str(args.folder), args, t0)
            return
        child = child_easyfit if args.child == "easyfit" else child_loop
        child(str(args.folder), args.batch_size, args.classes, t0)
        return
    if args.recipe == "resnet50":
        per_class = round(args.images * 0.9 / 10)
        if not (args.folder / "train").is_dir():
            import easyfit as ef  # its environment settings stay in this process: children get USER_ENV

            ef.datasets.synthetic_images(
                args.folder, classes=10, per_class=(per_class, args.images // 10 - per_class)
            )
        count = {
            split: sum(len(fs) for _, _, fs in os.walk(args.folder / split)) for split in ("train", "val")
        }
        args.files, val, args.classes = count["train"], count["val"], 10  # as found, if written before
    else:
        if args.imagenet:
            args.files, args.val_files, args.classes = IMAGENET
        val = args.val_files if args.val_files is not None else max(args.classes, args.files // 25)
        write_folder(args.folder, args.files, val, args.classes, args.size)
    sum(len(fs) for _, _, fs in os.walk(args.folder))  # the listing in the page cache for every run
    env = {k: v for k, v in USER_ENV.items() if k not in _CACHE_SETTINGS}
    # the children time the easyfit of this checkout, not another one installed (editable) elsewhere
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as cache:
        env["XDG_CACHE_HOME"] = cache  # an empty per-user cache: the first easyfit run is cold
        rows = [
            {"label": "hand-written DALI + Flax loop", **_run("loop", args.folder, args, env)},
            {"label": "easyfit, cold (empty compilation cache)", **_run("easyfit", args.folder, args, env)},
            {"label": "easyfit, warm (second run)", **_run("easyfit", args.folder, args, env)},
        ]
        shutil.rmtree(cache, ignore_errors=True)
    if args.recipe == "resnet50":
        print(
            f"{args.model} recipe ({args.image_size}x{args.image_size} crops, bfloat16), "
            f"{args.files:,} training JPEGs of 300-550 px, batch {args.batch_size}"
        )
    else:
        print(
            f"{args.files:,} training + {val:,} validation files, {args.classes:,} classes, "
            f"{args.size}x{args.size} JPEGs, batch {args.batch_size}"
        )
    print("| run | seconds to the first step | host RSS at the first step (MiB) |")
    print("| --- | ---: | ---: |")
    for r in rows:
        print(f"| {r['label']} | {r['first_step_s']:.2f} | {r['rss_mib']:,.0f} |")
    if args.recipe == "resnet50":
        print("steps in easyfit's first dispatch:", ", ".join(str(r.get("steps_done")) for r in rows[1:]))
    if args.json:
        args.json.write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
