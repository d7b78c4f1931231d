"""What building easyfit's DALI training pipelines costs, and whether anything else in the
process can run Python meanwhile: each ``Pipeline.build`` timed, with the longest stretch in
which a thread sleeping 1 ms at a time could not take the interpreter lock back.

    python benchmarks/pipeline_build.py FOLDER [--image-size 224] [--batch-size 256] [--json ROWS_JSON]

FOLDER holds ``train/<class>/*`` (``startup.py --recipe`` writes one). The recipe's training
source (``imagenet_recipe.recipe_source``: random resized crops, flips, ImageNet
normalisation) is opened by easyfit's loader, one fresh interpreter per set-up: ``plain``;
``runtime_first`` (JAX's runtime started and a first computation run before); ``trivial_first``
(a DALI pipeline with no operator but a copy built before: DALI's own set-up on the device);
``hw_decoder_off`` (``easyfit.data.images.HW_DECODER_LOAD = 0``: no image for the hardware
JPEG decoder). On a CPU-only machine the pipelines run on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from children import last_json, run_again, watch_lock  # noqa: E402

SETUPS = ("plain", "runtime_first", "trivial_first", "hw_decoder_off")


def child(args: argparse.Namespace) -> dict:
    import jax
    import numpy as np
    import nvidia.dali as dali
    from imagenet_recipe import recipe_source
    from nvidia.dali import fn, pipeline_def

    import easyfit as ef
    from easyfit.data.loader import Loader
    from easyfit.parallel import Placement

    gaps: list[tuple[float, float]] = []  # (start, seconds) the lock was held by native code
    watch_lock(lambda start, end: gaps.append((start, end - start)))
    builds: list[tuple[float, float]] = []
    build = dali.Pipeline.build

    def timed(pipe):
        start = time.time()
        build(pipe)
        if not pipe._built_timed:  # DALI calls build again on every run: the first one only
            pipe._built_timed = True
            builds.append((start, time.time() - start))

    dali.Pipeline._built_timed = False
    dali.Pipeline.build = timed
    device = 0 if jax.default_backend() == "gpu" else None
    out: dict = {"setup": args.setup}
    if args.setup == "runtime_first":
        start = time.time()
        jax.block_until_ready(jax.random.PRNGKey(0))
        out["runtime_s"] = round(time.time() - start, 3)
    if args.setup == "trivial_first":

        @pipeline_def(batch_size=8, num_threads=2, device_id=device)
        def copy():
            data = fn.external_source(source=lambda: [np.zeros(4, np.uint8)] * 8, batch=True)
            return data.gpu() if device is not None else data

        copy().build()
    if args.setup == "hw_decoder_off":
        ef.data.images.HW_DECODER_LOAD = 0.0
    source = recipe_source(argparse.Namespace(root=args.folder, hw_load=None, image_size=args.image_size))
    placement = Placement.create()
    plan = ef.data.Plan(len(source), args.batch_size, seed=0, num_shards=placement.num_shards)
    start = time.time()
    loader = Loader(source, plan, placement, training=True)
    out["loader_s"] = round(time.time() - start, 3)
    start = time.time()
    next(loader)
    out["first_chunk_s"] = round(time.time() - start, 3)
    loader.close()

    def held(begin: float, seconds: float) -> float:  # the longest lockless stretch inside
        inside = [g for s, g in gaps if s >= begin - 0.005 and s + g <= begin + seconds + 0.05]
        return round(max(inside, default=0.0), 3)

    out["builds_s"] = [round(s, 3) for _, s in builds]
    out["lock_held_s"] = [held(b, s) for b, s in builds]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--json")
    ap.add_argument("--setup", choices=SETUPS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.setup:
        print(json.dumps(child(args)), flush=True)
        os._exit(0)  # nothing after the measurement
    rows = [last_json(run_again(__file__, "--setup", s), s) for s in SETUPS]
    print("| set-up | loader s | builds s | interpreter lock held s | first chunk s |")
    print("| --- | ---: | --- | --- | ---: |")
    for r in rows:
        builds = " / ".join(f"{b:.2f}" for b in r["builds_s"])
        held = " / ".join(f"{h:.2f}" for h in r["lock_held_s"])
        print(f"| {r['setup']} | {r['loader_s']:.2f} | {builds} | {held} | {r['first_chunk_s']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
