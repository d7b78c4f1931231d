"""How long the recipe model's initialisation takes to compile for the default device (a GPU)
and for the host, alone and beside the train step's compilation, with no compilation cache:
why easyfit initialises states on the host (``easyfit.core.state.HOST_INIT_BYTES``).

    python benchmarks/init_compile.py [--model resnet50] [--width 64] [--size 224] [--batch-size 256]
        [--json ROWS_JSON]

Each set-up runs in a fresh interpreter (nothing compiled before it): the initialisation alone
on the device and on the host; the train step alone; each initialisation while the train step
compiles in a thread (started first); the host's with the options easyfit compiles it with
(``easyfit.core.state.CPU_INIT_OPTIONS``: LLVM's first optimisation level), alone and beside
the train step. Then the host's initial values against the device's, and the host's with those
options against its default (bitwise equal leaves, largest difference). On a CPU-only machine
host and device are the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from children import USER_ENV, last_json, run_again  # noqa: E402

SETUPS = (
    "init_device",
    "init_host",
    "init_host_options",
    "train",
    "init_device_beside_train",
    "init_host_beside_train",
    "init_host_options_beside_train",
)


def child(args: argparse.Namespace) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from imagenet_recipe import as_linen, example

    from easyfit.core.state import CPU_INIT_OPTIONS

    ex = example()
    model_init, model_apply = as_linen(
        {"resnet18": ex.resnet18, "resnet50": ex.resnet50}[args.model](10, args.width)
    )
    x1 = jnp.zeros((1, args.size, args.size, 3))
    rng = jax.random.PRNGKey(0)
    tx = ex.optimizer(args.batch_size, 100, 90)
    out: dict = {}

    def init(key, x):
        return model_init({"params": key, "dropout": key}, x, train=False)

    def compile_train() -> None:
        abstract = jax.eval_shape(init, rng, x1)
        params, stats = abstract["params"], abstract["batch_stats"]

        def loss_fn(p, stats, x, y):
            p16 = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), p)
            logits, new = model_apply(
                {"params": p16, "batch_stats": stats},
                x.astype(jnp.bfloat16),
                train=True,
                mutable=["batch_stats"],
            )
            return ex.smoothed_cross_entropy(logits.astype(jnp.float32), y).mean(), new["batch_stats"]

        def step(state, x, y):
            p, o, stats = state
            (loss, stats), g = jax.value_and_grad(loss_fn, has_aux=True)(p, stats, x, y)
            updates, o = tx.update(g, o, p)
            return (optax.apply_updates(p, updates), o, stats), loss

        images = jax.ShapeDtypeStruct((args.batch_size, args.size, args.size, 3), jnp.float16)
        labels = jax.ShapeDtypeStruct((args.batch_size,), jnp.int32)
        start = time.perf_counter()
        lowered = jax.jit(step, donate_argnums=0).lower(
            (params, jax.eval_shape(tx.init, params), stats), images, labels
        )
        mid = time.perf_counter()
        lowered.compile()
        out["train_lower_s"], out["train_compile_s"] = (
            round(mid - start, 3),
            round(time.perf_counter() - mid, 3),
        )

    def init_on(device, prefix: str, options: dict | None = None):
        start = time.perf_counter()
        with jax.default_device(device):
            lowered = jax.jit(init).lower(rng, x1)
            mid = time.perf_counter()
            compiled = lowered.compile(compiler_options=options)
            end = time.perf_counter()
            values = jax.block_until_ready(compiled(rng, x1))
        out[f"{prefix}_lower_s"], out[f"{prefix}_compile_s"] = round(mid - start, 3), round(end - mid, 3)
        out[f"{prefix}_run_s"] = round(time.perf_counter() - end, 3)
        return values

    device, host = jax.devices()[0], jax.local_devices(backend="cpu")[0]
    jax.block_until_ready(jnp.zeros(1) + 1)  # the runtime's start is not timed
    setup = args.setup
    if setup == "values":
        a, b = init_on(device, "init_device"), init_on(host, "init_host")
        c = init_on(host, "init_host_options", CPU_INIT_OPTIONS)
        for name, (u, v) in {"device_host": (a, b), "host_options": (b, c)}.items():
            pairs = list(zip(jax.tree_util.tree_leaves(u), jax.tree_util.tree_leaves(v), strict=True))
            out[f"{name}_leaves"] = len(pairs)
            same = [bool(np.array_equal(np.asarray(p), np.asarray(q))) for p, q in pairs]
            out[f"{name}_equal_leaves"] = sum(same)
            out[f"{name}_max_abs_diff"] = max(
                float(np.max(np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)))) for p, q in pairs
            )
        return out
    beside = setup.endswith("_beside_train")
    thread = threading.Thread(target=compile_train) if beside or setup == "train" else None
    if thread is not None:
        thread.start()
    if beside:
        time.sleep(3)  # the train step is traced first, as fit does
    if setup.startswith("init_"):
        init_on(host if "host" in setup else device, "init", CPU_INIT_OPTIONS if "options" in setup else None)
    if thread is not None:
        thread.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["resnet50", "resnet18"], default="resnet50")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--setup", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.setup:
        print(json.dumps(child(args)))
        return
    env = {**USER_ENV, "EASYFIT_COMPILATION_CACHE": "0", "JAX_ENABLE_COMPILATION_CACHE": "false"}
    rows = {s: last_json(run_again(__file__, "--setup", s, env=env), s) for s in (*SETUPS, "values")}
    print(f"{args.model} (width {args.width}) on {args.size}x{args.size} inputs, batch {args.batch_size}")
    print("| set-up | initialisation: lower / compile / run s | train step: lower / compile s |")
    print("| --- | ---: | ---: |")
    for s in SETUPS:
        r = rows[s]
        init = (
            " / ".join(f"{r[k]:.2f}" for k in ("init_lower_s", "init_compile_s", "init_run_s"))
            if "init_lower_s" in r
            else ""
        )
        train = f"{r['train_lower_s']:.2f} / {r['train_compile_s']:.2f}" if "train_lower_s" in r else ""
        print(f"| {s} | {init} | {train} |")
    v = rows["values"]
    pairs = {"device_host": "host against device", "host_options": "host: options against default"}
    for name, what in pairs.items():
        print(
            f"{what}: {v[f'{name}_equal_leaves']} of {v[f'{name}_leaves']} leaves equal, "
            f"largest difference {v[f'{name}_max_abs_diff']:.3g}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
