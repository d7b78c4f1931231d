"""Epoch 1 against epoch 2 of a streamed image folder: what the host checks of each file's
first feed cost the first epoch (they run in checker child processes, ahead of the feed:
``easyfit.data.check_pool``).

    python benchmarks/epoch_checks.py FOLDER [--files 20000] [--classes 10] [--size 16]
        [--batch-size 256] [--repeat 3] [--children N] [--val-files 0] [--json ROWS_JSON]

FOLDER gets ``train/<class>/*.jpg``: tiny JPEGs (benchmarks/startup.py's folder, so that
decoding does not dominate), unless it holds one written with the same arguments. Each of
``--repeat`` runs is a fresh interpreter that fits a small convolutional model for two epochs
with ``cache=False`` (every file read, and checked on its first feed, in epoch 1) and prints,
per epoch: its seconds (``on_epoch_begin`` to ``on_epoch_end``), its seconds after the first
step (compilation left out), fit's ``input_wait``, and the seconds DALI's feed callbacks spent
in the source's ``feed`` (where the checks ran before the pool, and where a feed waits for
them now), and the CPU seconds of the process (its threads, DALI's included) and of its
checker children, with the machine's busy cores on average (from ``/proc``). This script
prints the medians. ``--children``: checker processes (0: the checks run in the feed).
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

KEYS = ("seconds", "after_first_step", "input_wait", "feed", "cpu_process", "cpu_children", "busy_cores")


def cpu() -> tuple[float, float, float]:
    """CPU seconds so far: of this process (all its threads, DALI's included), of its child
    processes that run (the checker children), and the machine's busy core-seconds (Linux's
    ``/proc``; zeros elsewhere)."""
    times = os.times()
    own, children, busy = times.user + times.system, 0.0, 0.0
    try:
        tick = os.sysconf("SC_CLK_TCK")
        for task in os.listdir("/proc/self/task"):
            for pid in Path(f"/proc/self/task/{task}/children").read_text().split():
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:  # ended since
                    continue
                children += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = (sum(ticks[:8]) - ticks[3] - ticks[4]) / tick  # all but idle and iowait
    except OSError:
        pass
    return own, children, busy


def child(root: str, batch: int, classes: int, children: int | None) -> None:
    import optax

    import easyfit as ef

    if children is not None:
        from easyfit.data.check_pool import CHILDREN_SETTING

        os.environ[CHILDREN_SETTING] = str(children)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from startup import _model

    fed = [0.0]  # seconds in feed so far
    marks: dict[str, list[float]] = {"begin": [], "first": [], "end": [], "fed": []}
    usage: list[tuple[float, float, float]] = []  # cpu() at each epoch's begin and end

    class Timed(ef.data.ImageFolder):
        def feed(self, indices):
            start = time.perf_counter()
            try:
                return super().feed(indices)
            finally:
                fed[0] += time.perf_counter() - start

    class Clock(ef.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            marks["begin"].append(time.perf_counter())
            marks["fed"].append(fed[0])
            usage.append(cpu())

        def on_train_batch_end(self, batch_index, logs=None):
            if len(marks["first"]) < len(marks["begin"]):
                float(logs["loss"])  # the first step has run
                marks["first"].append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            marks["end"].append(time.perf_counter())
            usage.append(cpu())

    trainer = ef.Trainer(_model(classes), optimizer=optax.sgd(0.1, momentum=0.9), seed=0)
    history = trainer.fit(
        Timed(root), epochs=2, batch_size=batch, cache=False, verbose=0, callbacks=[Clock()]
    )
    marks["fed"].append(fed[0])
    rows = [
        {
            "epoch": e + 1,
            "seconds": round(marks["end"][e] - marks["begin"][e], 3),
            "after_first_step": round(marks["end"][e] - marks["first"][e], 3),
            "input_wait": round(float(history.history["input_wait"][e]), 4),
            "feed": round(marks["fed"][e + 1] - marks["fed"][e], 3),
            "cpu_process": round(usage[2 * e + 1][0] - usage[2 * e][0], 2),
            "cpu_children": round(usage[2 * e + 1][1] - usage[2 * e][1], 2),
            "busy_cores": round(
                (usage[2 * e + 1][2] - usage[2 * e][2]) / (marks["end"][e] - marks["begin"][e]), 2
            ),
        }
        for e in range(2)
    ]
    print(json.dumps(rows))


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument(
        "--val-files", type=int, default=0, help="validation files (startup.py's --imagenet folder: 51246)"
    )
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--children", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    train = str(args.folder / "train")
    if args.child:
        child(train, args.batch_size, args.classes, args.children)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from startup import write_folder

    write_folder(args.folder, args.files, args.val_files, args.classes, args.size)
    command = [sys.executable, __file__, str(args.folder), "--classes", str(args.classes), "--child"]
    command += ["--batch-size", str(args.batch_size)]
    if args.children is not None:
        command += ["--children", str(args.children)]
    runs = []
    for _ in range(args.repeat):
        out = subprocess.run(command, capture_output=True, text=True, check=False, env=dict(os.environ))
        if out.returncode != 0:
            raise SystemExit(out.stdout[-2000:] + out.stderr[-3000:])
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]), flush=True)
    print(
        "| epoch | seconds | seconds after the first step | input_wait | seconds in feed "
        "| CPU s, this process | CPU s, checker children | busy cores (machine) |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for e in range(2):
        s, a, w, f, p, c, b = (statistics.median(run[e][k] for run in runs) for k in KEYS)
        print(f"| {e + 1} | {s:.2f} | {a:.2f} | {w:.3f} | {f:.2f} | {p:.1f} | {c:.1f} | {b:.1f} |")
    if args.json is not None:
        args.json.write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
