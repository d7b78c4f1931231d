"""Throughput of easyfit's input side alone (no training): samples/s of the Loader.

python benchmarks/loader_only.py DATA_ROOT/train [--batch-size 200] [--threads N] [--prefetch N]
"""

import argparse
import json
import time

import jax

import easyfit as ef
from easyfit.data.loader import Loader
from easyfit.parallel import Placement

ap = argparse.ArgumentParser()
ap.add_argument("root")
ap.add_argument("--batch-size", type=int, default=200)
ap.add_argument("--threads", type=int, default=None)
ap.add_argument("--prefetch", type=int, default=2)
ap.add_argument("--decoder", default="auto")
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument("--pipelines", type=int, default=None, help="DALI pipelines per GPU")
ap.add_argument("--k", type=int, default=1, help="steps per chunk")
args = ap.parse_args()

source = ef.data.ImageFolder(args.root, decoder=args.decoder)
placement = Placement.create()
plan = ef.data.Plan(len(source), args.batch_size, num_shards=placement.num_shards, steps_per_execution=args.k)
loader = Loader(
    source,
    plan,
    placement,
    num_threads=args.threads,
    prefetch=args.prefetch,
    pipelines_per_device=args.pipelines,
)
rates = []
for _ in range(args.epochs):
    t = time.perf_counter()
    for _ in range(plan.chunks_per_epoch):
        batch = next(loader)
    jax.block_until_ready(batch)
    rates.append(len(source) / (time.perf_counter() - t))
print(
    json.dumps(
        {
            "threads": args.threads,
            "prefetch": args.prefetch,
            "decoder": args.decoder,
            "pipelines": args.pipelines,
            "k": args.k,
            "samples_per_s": [round(r) for r in rates],
        }
    )
)
