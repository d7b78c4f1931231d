"""What building easyfit's DALI training pipelines costs, and whether anything else in the
process can run Python meanwhile: each ``Pipeline.build`` timed, with the longest stretch in
which a thread sleeping 1 ms at a time could not take the interpreter lock back.

    python benchmarks/pipeline_build.py FOLDER [--image-size 224] [--batch-size 256] [--json ROWS_JSON]
    python benchmarks/pipeline_build.py --graphs [--json ROWS_JSON]

FOLDER holds ``train/<class>/*`` (``startup.py --recipe`` writes one). The recipe's training
source (``imagenet_recipe.recipe_source``: random resized crops, flips, ImageNet
normalisation) is opened by easyfit's loader, one fresh interpreter per set-up: ``plain``;
``runtime_first`` (JAX's runtime started and a first computation run before); ``trivial_first``
(a DALI pipeline with no operator but a copy built before: DALI's own set-up on the device);
``hw_decoder_off`` (``easyfit.data.images.HW_DECODER_LOAD = 0``: no image for the hardware
JPEG decoder). On a CPU-only machine the pipelines run on the CPU.

``--graphs`` times instead three builds of bare DALI graphs of the random resized crop, each in
a fresh interpreter (batch 85, 4 threads, as one of easyfit's three pipelines of a 256 batch on
a 16-core GPU machine): ``peek_and_slice`` (``fn.peek_image_shape``, then
``fn.decoders.image_slice`` with the window: what easyfit built before), ``decode_and_slice``
(``fn.decoders.image``, then ``fn.slice`` with the window from the decoded shape: what it builds
now), ``decode`` (the decoder alone) and ``peek`` (the peek alone).
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
GRAPHS = ("peek_and_slice", "decode_and_slice", "decode", "peek")


def graph_builds(graph: str) -> dict:
    """Seconds of three builds of the bare DALI graph ``graph`` (see the module's text)."""
    import jax
    from nvidia.dali import fn, pipeline_def, types

    from easyfit.data.augment import Augment

    gpu = jax.default_backend() == "gpu"
    where = "mixed" if gpu else "cpu"
    hw = {"hw_decoder_load": 0.9} if gpu else {}
    # half the area at the image's aspect ratio, in the middle: easyfit's window of fixed draws
    fixed = {"area": 0.5, "log_ratio": 0.0, "crop_y": 0.5, "crop_x": 0.5}

    def window(shape):
        return Augment.window({k: fn.constant(fdata=v, shape=[]) for k, v in fixed.items()}, shape)

    @pipeline_def(batch_size=85, num_threads=4, device_id=0 if gpu else None, seed=1)  # type: ignore[call-overload]
    def pipe():
        encoded = fn.external_source(name="encoded", dtype=types.DALIDataType.UINT8, ndim=1)
        if graph == "peek":
            return fn.peek_image_shape(encoded)
        if graph == "peek_and_slice":
            start, size = window(fn.peek_image_shape(encoded))
            images = fn.decoders.image_slice(encoded, start, size, axis_names="HW", device=where, **hw)
        else:
            images = fn.decoders.image(encoded, device=where, **hw)
            if graph == "decode_and_slice":
                start, size = window(images.shape())
                images = fn.slice(images, start, size, axis_names="HW")
        return fn.resize(images, size=[224, 224])

    builds = []
    for _ in range(3):
        p = pipe()
        start = time.time()
        p.build()
        builds.append(round(time.time() - start, 3))
    return {"graph": graph, "builds_s": builds}


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
    ap.add_argument("folder", nargs="?")
    ap.add_argument("--graphs", action="store_true", help="time bare DALI graphs of the crop instead")
    ap.add_argument("--graph", choices=GRAPHS, help=argparse.SUPPRESS)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--json")
    ap.add_argument("--setup", choices=SETUPS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.graph:
        print(json.dumps(graph_builds(args.graph)), flush=True)
        os._exit(0)
    if args.graphs:
        graphs = [last_json(run_again(__file__, "--graph", g), g) for g in GRAPHS]
        print("| graph | builds s |\n| --- | --- |")
        for r in graphs:
            print(f"| {r['graph']} | {' / '.join(f'{b:.2f}' for b in r['builds_s'])} |")
        if args.json:
            Path(args.json).write_text(json.dumps(graphs, indent=1))
        return
    if args.folder is None:
        ap.error("FOLDER is needed (or --graphs)")
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
