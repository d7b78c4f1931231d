"""Do GPU runs repeat bit for bit? ``Trainer(deterministic=True)`` against ``False``: two runs,
and a run SIGKILLed mid-epoch and resumed against a run never stopped; and the speed of each.

    python benchmarks/deterministic.py ROOT [--images 6400] [--epochs 3] [--batch-size 128]
        [--model resnet18] [--width 64] [--image-size 224] [--flags true,false] [--json OUT]

ROOT gets an ImageNet-shaped folder (``ef.datasets.synthetic_images``: ``--images`` JPEGs of
``--sides`` pixels in 10 classes) unless it holds a ``train/`` folder already. Every run is a
fit of examples/imagenet_resnet.py's ResNet (BatchNorm) with its optimizer and loss, in
bfloat16, on ``train/`` with the recipe's random resized crop and flip, ``seed=0``, each in a
fresh interpreter with an empty compilation cache of its own (so each run compiles, and picks
its kernels, anew; ``--shared-cache DIR`` shares one, for a quicker smoke run). For each ``--flags`` value:

* ``run 1`` and ``run 2``: two uninterrupted fits;
* ``killed``: the same fit with ``BackupAndRestore(save_freq=2)``, which SIGKILLs itself
  (``os.kill``) after dispatch ``--kill-at`` of epoch 1, a few seconds after a backup;
* ``resumed``: the same command again, which resumes from the backup and finishes.

It prints, per flag, max |Δ| over every parameter and BatchNorm statistic for run 1 against
run 2 and for run 1 against the resumed run, and whether they are bit-identical; and the steady
images/s (median over the epochs after the first, of runs 1 and 2) of each flag.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from children import USER_ENV, epoch_timer, last_json, run_again

HERE = Path(__file__).resolve().parent


def child(args) -> None:
    """One fit; writes the final variables to ``args.out`` and prints one JSON line."""
    import warnings

    sys.path.insert(0, str(HERE))
    from imagenet_recipe import example, recipe_source

    import easyfit as ef

    deterministic = args.deterministic == "true"
    ex = example()
    train_dir = os.path.join(args.root, "train")
    classes = len([d for d in os.listdir(train_dir) if os.path.isdir(os.path.join(train_dir, d))])
    model = {"resnet18": ex.resnet18, "resnet50": ex.resnet50}[args.model](classes, args.width)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = ef.Trainer(  # first: deterministic=True must come before JAX starts its backend
            model,
            optimizer=ex.optimizer(args.batch_size, 100, args.epochs),
            loss=ex.smoothed_cross_entropy,
            metrics=["accuracy"],
            precision="bfloat16",
            seed=0,
            steps_per_execution=args.spe,
            deterministic=deterministic,
        )
    import jax
    import numpy as np

    train = recipe_source(argparse.Namespace(root=args.root, hw_load=None, image_size=args.image_size))
    seconds, timer = epoch_timer(ef)
    callbacks: list = [timer]
    resumed_from = None
    if args.backup:
        backup = ef.callbacks.BackupAndRestore(args.backup, save_freq=2)
        point = backup.restore_point()
        resumed_from = None if point is None else [point.epoch, point.batch]
        callbacks.insert(0, backup)
        if args.kill_at is not None and point is None:

            def kill(batch, logs):
                if trainer.progress.epoch == 1 and batch == args.kill_at:
                    time.sleep(args.kill_delay)  # lets the asynchronous backup before this finish
                    os.kill(os.getpid(), signal.SIGKILL)

            callbacks.append(ef.callbacks.LambdaCallback(on_train_batch_end=kill))
    trainer.fit(train, epochs=args.epochs, batch_size=args.batch_size, verbose=0, callbacks=callbacks)
    leaves = jax.tree_util.tree_leaves((trainer.state.params, trainer.state.model_state))
    np.save(args.out, np.concatenate([np.asarray(a, np.float32).ravel() for a in leaves]))
    print(
        json.dumps(
            {
                "epoch_seconds": seconds,
                "images": len(train),
                "resumed_from": resumed_from,
                "step": int(trainer.state.step),
                "backend": jax.default_backend(),
                "flag_in_xla_flags": "--xla_gpu_deterministic_ops=true" in os.environ.get("XLA_FLAGS", ""),
                "warnings": [str(w.message) for w in caught if "deterministic" in str(w.message)],
            }
        ),
        flush=True,
    )


def _run(args, flag: str, out: Path, backup: Path | None = None, kill: bool = False) -> dict | None:
    """One child run in a fresh interpreter with its own empty compilation cache (or, with
    ``--shared-cache``, one cache for every run); its JSON line, or None when it was SIGKILLed
    as asked."""
    extra = ["--child", "--deterministic", flag, "--out", str(out)]
    if backup is not None:
        extra += ["--backup", str(backup)]
    if kill:
        extra += ["--kill-at", str(args.kill_at)]
    with tempfile.TemporaryDirectory() as cache:
        env = {**USER_ENV, "JAX_COMPILATION_CACHE_DIR": args.shared_cache or cache}
        env.pop("EASYFIT_COMPILATION_CACHE", None)
        proc = run_again(__file__, *extra, env=env)
    if kill and proc.returncode == -signal.SIGKILL:
        return None
    if kill and proc.returncode == 0:
        raise SystemExit(f"the run to kill ({flag}) finished without being killed: lower --kill-at")
    return last_json(proc, f"the deterministic={flag} run")


def _compare(a: Path, b: Path) -> dict:
    import numpy as np

    x, y = np.load(a), np.load(b)
    return {"max_abs_diff": float(np.max(np.abs(x - y))), "bit_identical": bool(np.array_equal(x, y))}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("root")
    ap.add_argument("--images", type=int, default=6400, help="JPEGs to write (train + val)")
    ap.add_argument("--sides", default="300,550", help="the JPEGs' smallest and largest side")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--model", choices=["resnet18", "resnet50"], default="resnet18")
    ap.add_argument("--width", type=int, default=64, help="the ResNet's width")
    ap.add_argument("--image-size", type=int, default=224, help="the crops' side")
    ap.add_argument(
        "--spe", type=int, default=2, help="steps_per_execution (a dispatch is what is killed after)"
    )
    ap.add_argument("--kill-at", type=int, default=10, help="the dispatch of epoch 1 after which to SIGKILL")
    ap.add_argument("--kill-delay", type=float, default=3.0, help="seconds between the backup and the kill")
    ap.add_argument("--flags", default="true,false", help="deterministic= values to measure")
    ap.add_argument(
        "--shared-cache",
        default=None,
        metavar="DIR",
        help="one compilation cache for every run (quicker; by default each run compiles anew)",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--deterministic", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--backup", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if not os.path.isdir(os.path.join(args.root, "train")):
        import easyfit as ef  # in this process only: the runs start from children.USER_ENV

        per_class = round(args.images * 0.9 / 10)
        lo, hi = (int(v) for v in args.sides.split(","))
        ef.datasets.synthetic_images(
            args.root, classes=10, per_class=(per_class, args.images // 10 - per_class), size=(lo, hi)
        )
    results = {}
    with tempfile.TemporaryDirectory() as work:
        w = Path(work)
        for flag in args.flags.split(","):
            t = time.perf_counter()
            one = _run(args, flag, w / f"{flag}-1.npy")
            two = _run(args, flag, w / f"{flag}-2.npy")
            _run(args, flag, w / f"{flag}-resumed.npy", backup=w / f"{flag}-backup", kill=True)
            resumed = _run(args, flag, w / f"{flag}-resumed.npy", backup=w / f"{flag}-backup")
            steady = [one["images"] / s for r in (one, two) for s in r["epoch_seconds"][1:]]
            results[flag] = {
                "two_runs": _compare(w / f"{flag}-1.npy", w / f"{flag}-2.npy"),
                "killed_and_resumed": {
                    **_compare(w / f"{flag}-1.npy", w / f"{flag}-resumed.npy"),
                    "resumed_from_epoch_batch": resumed["resumed_from"],
                },
                "steady_images_per_s": round(statistics.median(steady)) if steady else None,
                "epoch_seconds": [one["epoch_seconds"], two["epoch_seconds"]],
                "steps": [one["step"], two["step"], resumed["step"]],
                "backend": one["backend"],
                "flag_in_xla_flags": one["flag_in_xla_flags"],
                "warnings": one["warnings"],
                "seconds": round(time.perf_counter() - t, 1),
            }
            print(f"deterministic={flag}: {json.dumps(results[flag])}", flush=True)
    some = next(iter(results.values()))
    print(
        f"\n{args.model} (width {args.width}), {args.image_size}x{args.image_size} random resized crops, "
        f"bfloat16, batch {args.batch_size}, {args.epochs} epochs of {one['images']:,} images, "
        f"on {some['backend']}"
    )
    print("| deterministic | pair | max abs diff | bit-identical |")
    print("| --- | --- | ---: | --- |")
    for flag, r in results.items():
        where = r["killed_and_resumed"]["resumed_from_epoch_batch"]
        for pair, key in (
            ("run 1 vs run 2", "two_runs"),
            (f"SIGKILL at {where} + resume vs run 1", "killed_and_resumed"),
        ):
            same = "yes" if r[key]["bit_identical"] else "no"
            print(f"| {flag} | {pair} | {r[key]['max_abs_diff']:.3g} | {same} |")
    print("\n| deterministic | steady images/s |")
    print("| --- | ---: |")
    for flag, r in results.items():
        print(f"| {flag} | {r['steady_images_per_s']:,} |")
    if "true" in results and "false" in results and results["false"]["steady_images_per_s"]:
        ratio = results["true"]["steady_images_per_s"] / results["false"]["steady_images_per_s"]
        print(f"\ndeterministic=True runs at {ratio:.3f}x the speed of deterministic=False")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
