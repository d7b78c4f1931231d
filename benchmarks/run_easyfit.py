"""One easyfit run of reference program 1 (MLP, SGD 0.1/0.9, batch 200); prints JSON figures.

    python benchmarks/run_easyfit.py DATA_ROOT [--epochs 5] [--batch-size 200] [--cache auto]
        [--steps-per-execution N] [--threads N]

Used by benchmarks/bench.py, which runs each mode in its own process (clean peak memory).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import jax
import optax

import easyfit as ef
from easyfit._demo import MLP  # reference program 1's model, as the demo trains it


class EpochTimer(ef.callbacks.Callback):
    """Training seconds per epoch (validation excluded, as in the reference loop), and when
    (``time.perf_counter()``) each epoch's training ended."""

    def __init__(self):
        super().__init__()
        self.seconds: list[float] = []
        self.ends: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._t = time.perf_counter()
        self._done = False
        if epoch == 0:
            self.batch_ends: list[float] = []

    def on_train_batch_end(self, batch, logs=None):  # dispatch returned: no sync, logs unread
        if len(self.seconds) == 0:
            self.batch_ends.append(time.perf_counter() - self._t)

    def on_test_begin(self, logs=None):  # train metrics were just read: the device is done
        if not self._done:
            self.ends.append(time.perf_counter())
            self.seconds.append(self.ends[-1] - self._t)
            self._done = True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=200)
    ap.add_argument("--cache", default="auto")
    ap.add_argument("--steps-per-execution", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--pipelines", type=int, default=None, help="DALI pipelines per GPU")
    ap.add_argument("--label", default="easyfit")
    args = ap.parse_args()

    start = time.perf_counter()
    spe = args.steps_per_execution
    trainer = ef.Trainer(
        MLP(),
        optimizer=optax.sgd(0.1, momentum=0.9),
        seed=0,
        steps_per_execution=int(spe) if spe.isdigit() else spe,
        num_threads=args.threads,
        pipelines_per_device=args.pipelines,
    )
    timer = EpochTimer()
    fit_kwargs = (
        {} if args.cache == "none" else {"cache": {"auto": "auto", "true": True, "false": False}[args.cache]}
    )
    timer_start = time.perf_counter()
    history = trainer.fit(
        args.root, epochs=args.epochs, batch_size=args.batch_size, callbacks=[timer], verbose=2, **fit_kwargs
    )
    total = time.perf_counter() - start
    ends = timer.batch_ends or [0.0]
    print(
        f"first epoch: first dispatch returned after {ends[0]:.2f} s (compile), "
        f"{len(ends)} dispatches, last at {ends[-1]:.2f} s, epoch {timer.seconds[0]:.2f} s; "
        f"fit started {timer_start - start:.2f} s after the script",
        flush=True,
    )
    n = trainer._data._sources.train.num_samples  # noqa: SLF001 - a benchmark may look inside
    rates = [n / s for s in timer.seconds]
    stats = jax.devices()[0].memory_stats() or {}
    print(
        json.dumps(
            {
                "label": args.label,
                "backend": jax.default_backend(),
                "devices": jax.device_count(),
                "steady_samples_per_s": round(statistics.median(rates[1:]) if len(rates) > 1 else rates[0]),
                "first_epoch_s": round(timer.seconds[0], 3),
                # fit's setup (sources, pipelines, the LMDB cache's one read, compilation) included
                "setup_first_epoch_s": round(timer.ends[0] - timer_start, 3),
                "total_s": round(total, 3),
                "val_accuracy": round(history.history["val_accuracy"][-1], 4),
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                "peak_device_mb": round(stats.get("peak_bytes_in_use", 0) / 2**20) or None,
            }
        )
    )


if __name__ == "__main__":
    main()
