"""easyfit's fit in each mode against the hand-written DALI + Flax loop, same data, same run.

    python benchmarks/bench.py DATA_ROOT --reference SEED_LOOP.py|none [--epochs 5]
        [--modes stream,cache] [--json OUT.json]

DATA_ROOT holds train/<class>/* and val/<class>/* (for example MNIST written as JPEGs by
benchmarks/make_data.py), or train/ and val/ Caffe2 LMDBs (``make_data.py --format lmdb``;
easyfit detects them). SEED_LOOP.py is the hand-written reference loop (a DALI + Flax script
that takes DATA_ROOT and --epochs and prints one JSON line): for the LMDBs,
``benchmarks/lmdb_loop.py`` (DALI's Flax tutorial on ``fn.readers.caffe2``); ``none`` runs
easyfit's modes only.
Every run is reference program 1: the MLP 784-1024-1024-10, SGD(0.1, momentum 0.9), batch 200.
Each runs in its own process, one after the other; the table gives steady samples/s (median of
epochs 2..N, training only), first-epoch seconds (training only, from the epoch's start: the
reference loop's compilation is in it, easyfit's is not: fit compiles before the epoch starts),
seconds from setup to the first epoch's end (everything included: the reference loop's from
building its pipelines, easyfit's from calling fit; ``-`` where a reference script does not
report it), total seconds, final validation accuracy, peak host RSS, peak device memory (GPU)
and the ratio of steady samples/s to the first row's (the reference loop's unless
``--reference none``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = {"stream": ["--cache", "false"], "cache": ["--cache", "true"]}


def run(cmd: list[str]) -> tuple[dict, int]:
    """Runs ``cmd``; returns its last JSON line and its peak RSS in MiB."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        print("   ", line.rstrip(), flush=True)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"{cmd} failed ({status})")
    return json.loads(lines[-1]), round(usage.ru_maxrss / 1024)


def train_samples(root: str) -> tuple[int, str]:
    """The training samples under ``root`` and what holds them: the records of a ``train/``
    LMDB, else the files under ``train/``."""
    train = os.path.join(root, "train")
    if os.path.isfile(os.path.join(train, "data.mdb")):
        import lmdb

        with lmdb.open(train, readonly=True, lock=False) as env:
            return env.stat()["entries"], "Caffe2 LMDB"
    return sum(len(files) for _, _, files in os.walk(train)), "image files"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument(
        "--reference", required=True, help="the hand-written reference loop's script, or 'none' to skip it"
    )
    ap.add_argument("--modes", default="stream,cache")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    rows = []
    n_train, source = train_samples(args.root)
    if args.reference != "none":
        ref, rss = run([sys.executable, args.reference, args.root, "--epochs", str(args.epochs)])
        rows.append(
            {
                "label": f"hand-written reference loop ({Path(args.reference).name})",
                "backend": ref["backend"],
                "steady_samples_per_s": ref["steady_samples_per_s"],
                "first_epoch_s": ref.get(
                    "first_epoch_s", round(n_train / ref["first_epoch_samples_per_s"], 3)
                ),
                "setup_first_epoch_s": ref.get("setup_first_epoch_s"),
                "total_s": ref["total_s"],
                "val_accuracy": ref["val_accuracy"],
                "peak_rss_mb": rss,
                "peak_device_mb": ref.get("peak_device_mb"),
            }
        )
    for mode in args.modes.split(","):
        row, rss = run(
            [
                sys.executable,
                str(HERE / "run_easyfit.py"),
                args.root,
                "--epochs",
                str(args.epochs),
                "--label",
                f"easyfit fit, {mode}",
                *MODES[mode],
            ]
        )
        row["peak_rss_mb"] = rss
        rows.append(row)

    base = rows[0]["steady_samples_per_s"]
    print(f"\n{rows[0]['backend']}, {args.epochs} epochs, batch 200, {n_train} training samples ({source})\n")
    print(
        "| what | steady samples/s | first epoch s | setup + first epoch s | total s | val accuracy "
        "| peak RSS MiB | peak device MiB | x reference |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        setup = "-" if r.get("setup_first_epoch_s") is None else f"{r['setup_first_epoch_s']:.2f}"
        print(
            f"| {r['label']} | {r['steady_samples_per_s']:,} | {r['first_epoch_s']:.2f} | {setup} | "
            f"{r['total_s']:.1f} | {r['val_accuracy']:.4f} | {r['peak_rss_mb']:,} | "
            f"{r['peak_device_mb'] or '-'} | {r['steady_samples_per_s'] / base:.2f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
