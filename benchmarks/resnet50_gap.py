"""Where ``ef.models``' ResNet-50 train step spends its time on one GPU: the step alone (one
batch held on the device, bfloat16 passes on float32 weights, SGD with momentum), varied one
setting at a time against the same baseline, each variant in a fresh process.

    python benchmarks/resnet50_gap.py [--variants base,b128,b384,xla-default,stem4,no-bn]
        [--batch-size 256] [--steps 60] [--json OUT.json]

The variants:

* ``base``: batch ``--batch-size``, in the process environment easyfit arranges on import
  (XLA's command buffers off, 32 CUDA work queues);
* ``b128``, ``b384``: the same at batch 128 and 384;
* ``xla-default``: XLA's and CUDA's own defaults (command buffers on, 8 work queues): what
  easyfit's settings, needed beside DALI, cost the step alone;
* ``stem4``: the images padded to four channels, so that the 7x7 stem convolution's input has
  a channel count tensor cores take without padding;
* ``no-bn``: every BatchNorm replaced by the identity: not a model to train, an upper bound on
  what BatchNorm's statistics and their backward pass cost.

Prints images/s per variant (median of three timed runs of ``--steps`` steps) and the share of
the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("base", "b128", "b384", "xla-default", "stem4", "no-bn")


def _measure(variant: str, batch: int, steps: int, size: int = 224) -> dict:
    user_env = {k: os.environ.get(k) for k in ("XLA_FLAGS", "CUDA_DEVICE_MAX_CONNECTIONS")}
    import easyfit as ef  # arranges its environment here, before JAX starts its backend

    if variant == "xla-default":  # the user's environment back, before the backend starts
        for k, v in user_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    batch = {"b128": 128, "b384": 384}.get(variant, batch)
    channels = 4 if variant == "stem4" else 3
    model = ef.models.ResNet(
        [3, 4, 6, 3], num_classes=1000, in_channels=channels, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)
    )
    if variant == "no-bn":
        for _, module in list(nnx.iter_graph(model)):
            if isinstance(module, nnx.List):
                for i, child in enumerate(module):
                    if isinstance(child, nnx.BatchNorm):
                        module[i] = _identity()
            elif isinstance(module, nnx.Module):
                for name, child in list(vars(module).items()):
                    if isinstance(child, nnx.BatchNorm):
                        setattr(module, name, _identity())
        left = [p for p, m in nnx.iter_graph(model) if isinstance(m, nnx.BatchNorm)]
        assert not left, f"BatchNorms left: {left}"
    graph, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.sgd(0.1, momentum=0.9, nesterov=True)

    def step(state, x, y):
        params, opt, rest = state

        def loss_fn(p):
            m = nnx.merge(graph, p, rest, copy=True)  # this trace's own variables
            m.train()  # BatchNorm on batch statistics, as in training
            logits = m(x)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, nnx.state(m, nnx.BatchStat)

        (loss, stats), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt = tx.update(g, opt, params)
        rest = nnx.merge_state(rest, stats) if len(jax.tree.leaves(stats)) else rest
        return (optax.apply_updates(params, updates), opt, rest), loss

    step = jax.jit(step, donate_argnums=0)
    state = (params, tx.init(params), rest)
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, size, size, channels), jnp.bfloat16)
    y = jnp.zeros((batch,), jnp.int32)
    t0 = time.perf_counter()
    state, loss = step(state, x, y)
    loss.block_until_ready()
    first = time.perf_counter() - t0
    for _ in range(5):
        state, loss = step(state, x, y)
    loss.block_until_ready()
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(steps):
            state, loss = step(state, x, y)
        loss.block_until_ready()
        rates.append(steps * batch / (time.perf_counter() - t))
    return {
        "variant": variant,
        "batch": batch,
        "images_per_s": round(statistics.median(rates)),
        "first_step_s": round(first, 1),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", ""),
        "device": str(jax.devices()[0].device_kind),
    }


def _identity():  # stands where a BatchNorm stood (no-bn)
    from flax import nnx

    class Identity(nnx.Module):
        def __call__(self, x, **kwargs):
            return x

    return Identity()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json", default=None)
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=224, help=argparse.SUPPRESS)  # smoke runs
    args = ap.parse_args()
    if args.variant:
        print(json.dumps(_measure(args.variant, args.batch_size, args.steps, args.size)))
        return
    results = []
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            sys.exit(f"--variants: {variant!r} is not one of {', '.join(VARIANTS)}")
        cmd = [sys.executable, __file__, "--variant", variant, "--batch-size", str(args.batch_size)]
        cmd += ["--size", str(args.size)]
        done = subprocess.run(cmd + ["--steps", str(args.steps)], capture_output=True, text=True)
        if done.returncode:
            print(f"{variant}: failed\n{done.stderr[-2000:]}", flush=True)
            continue
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    base = next((r["images_per_s"] for r in results if r["variant"] == "base"), None)
    for r in results:
        share = f"{r['images_per_s'] / base:.2f}x base" if base else ""
        print(f"{r['variant']:>12}  batch {r['batch']:>4}  {r['images_per_s']:>7} img/s  {share}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
