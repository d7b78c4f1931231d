"""Soak check: 50 epochs on a small folder; host RSS must not grow (> 50 MB after epoch 2).

    python benchmarks/soak.py [DATA_ROOT] [--epochs 50] [--cache auto|true|false]

Without DATA_ROOT, writes 2,000 + 500 images of the MNIST sample shipped in easyfit (offline).
Prints the RSS after each epoch and exits non-zero if it grew by 50 MB or more after epoch 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

import optax
from flax import linen as nn

import easyfit as ef


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        import os

        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class RSS(ef.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.mb: list[float] = []

    def on_epoch_end(self, epoch, logs=None):
        self.mb.append(round(rss_mb(), 1))


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(256)(x.reshape((x.shape[0], -1)))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", nargs="?")
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--cache", default="false")
    args = ap.parse_args()
    root = args.root or ef.datasets.sample_folder(tempfile.mkdtemp() + "/mnist", limit=(2000, 500))
    rss = RSS()
    ef.Trainer(MLP(), optimizer=optax.sgd(0.1, momentum=0.9)).fit(
        root,
        epochs=args.epochs,
        batch_size=100,
        verbose=0,
        callbacks=[rss],
        cache={"auto": "auto", "true": True, "false": False}[args.cache],
    )
    growth = rss.mb[-1] - rss.mb[1]
    print(json.dumps({"rss_mb_per_epoch": rss.mb, "growth_after_epoch_2_mb": round(growth, 1)}))
    sys.exit(0 if growth < 50 else 1)


if __name__ == "__main__":
    main()
