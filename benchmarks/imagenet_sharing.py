"""Parts of ``benchmarks/imagenet.py`` in which the model and the input share one GPU: the
input (DALI alone, then easyfit's loader) in a thread while the main thread trains on batches
held on the device (``overlap``), and the ways ``fit`` can dispatch the step, alone and beside
the loader (``chunk``). Each returns what ``imagenet.py`` prints for its part.
"""

from __future__ import annotations

import functools
import os
import time

from imagenet_recipe import model_step, recipe_source, train_pipeline


def _easyfit_input(args):
    """(one, close): ``one()`` waits for the next chunk of easyfit's loader for the recipe's
    training source and returns its rows."""
    import jax

    import easyfit as ef
    from easyfit.data import Loader
    from easyfit.parallel import Placement

    train = recipe_source(args)
    plan = ef.data.Plan(
        len(train), args.batch_size, shuffle=True, seed=0, steps_per_execution=max(1, 6000 // args.batch_size)
    )
    loader = Loader(
        train,
        plan,
        Placement.create(),
        training=True,
        num_threads=args.threads,
        pipelines_per_device=args.pipelines,
    )
    rows = plan.batch_size * plan.steps_per_execution

    def one() -> int:
        jax.block_until_ready(next(loader)["x"])
        return rows

    return one, loader.close


def beside(one, work) -> tuple[float, float]:
    """``work()`` (returns its rate) while a thread calls ``one()`` (returns rows) over and
    over: (the thread's rows/s, work's rate)."""
    import threading

    counted, stop = [0], threading.Event()

    def feed() -> None:
        while not stop.is_set():
            counted[0] += one()

    thread = threading.Thread(target=feed)
    t = time.perf_counter()
    thread.start()
    rate = work()
    stop.set()
    thread.join()
    return counted[0] / (time.perf_counter() - t), rate


def part_chunk(args) -> dict:
    """The train step as fit dispatches it, on batches held on the GPU: one step per dispatch
    (as the model part), k steps in one ``lax.scan`` (k as fit's ``"auto"`` picks), and the scan
    with the per-step ``lax.cond`` that skips padding steps or with a select instead; each alone
    and with easyfit's loader running beside it. What the dispatch costs, apart from the input."""
    import jax
    import jax.numpy as jnp

    from easyfit.core.steps import per_dispatch

    name = args.models.split(",")[0]
    b = args.batch_size
    state, step, _ = model_step(name, 10, b)
    k = per_dispatch(args.spe, len(recipe_source(args)), b, "gpu", False)  # as fit picks it
    xs = jax.random.normal(jax.random.PRNGKey(1), (k, b, 224, 224, 3), jnp.float16)
    ys = jnp.zeros((k, b), jnp.int32)
    mask = jnp.ones((k, b), bool)
    singles = [(xs[i], ys[i]) for i in range(k)]

    def plain(s, batch):
        x, y, _ = batch
        return step(s, x, y)[0], None

    def cond(s, batch):
        return jax.lax.cond(batch[2].any(), lambda s: plain(s, batch)[0], lambda s: s, s), None

    def select(s, batch):
        new = plain(s, batch)[0]
        return jax.tree_util.tree_map(lambda a, o: jnp.where(batch[2].any(), a, o), new, s), None

    def scanned(body):
        return jax.jit(lambda s, xs, ys, m: jax.lax.scan(body, s, (xs, ys, m))[0], donate_argnums=0)

    def per_step(s, xs, ys, m):
        for x, y in singles:
            s = step(s, x, y)[0]
        return s

    runs = {
        "per_step": per_step,
        "scan": scanned(plain),
        "scan_cond": scanned(cond),
        "scan_select": scanned(select),
    }
    out: dict = {"k": k}

    def rate(run) -> float:
        nonlocal state
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < args.seconds:
            state = jax.block_until_ready(run(state, xs, ys, mask))  # one chunk in flight
            n += k * b
        return n / (time.perf_counter() - t)

    for label, run in runs.items():
        state = run(state, xs, ys, mask)  # compiled
        jax.block_until_ready(state)
        out[label] = {"alone": round(rate(run))}
    one, close = _easyfit_input(args)
    for _ in range(3):
        one()
    for label, run in runs.items():
        input_rate, model_rate = beside(one, functools.partial(rate, run))
        out[label]["with_loader"] = {"model": round(model_rate), "input": round(input_rate)}
    close()
    return out


def part_overlap(args) -> dict:
    """The input and the model together, as fit overlaps them: a thread runs the input (DALI's
    pipeline alone, then easyfit's loader) while the main thread trains on a batch held on the
    device. Each side's rate alone and together: what the GPU allows when both share it."""

    import jax
    import jax.numpy as jnp

    name = args.models.split(",")[0]
    state, step, _ = model_step(name, 10, args.batch_size)
    x = jax.random.normal(jax.random.PRNGKey(1), (args.batch_size, 224, 224, 3), jnp.float16)
    y = jnp.zeros((args.batch_size,), jnp.int32)

    def train_for(seconds: float, depth: int = 10) -> float:
        """Model steps for ``seconds``, at most ``depth`` of them queued on the GPU."""
        nonlocal state
        n, t, loss = 0, time.perf_counter(), None
        while time.perf_counter() - t < seconds:
            for _ in range(depth):
                state, loss, _ = step(state, x, y)
            loss.block_until_ready()
            n += depth * args.batch_size
        return n / (time.perf_counter() - t)

    def raw_input(load=None):
        pipe = train_pipeline(
            os.path.join(args.root, "train"),
            args.batch_size,
            args.threads or (2 if args.cpu else 8),
            None if args.cpu else 0,
            None if args.cpu else load,
        )
        pipe.build()

        def one() -> int:
            images, _ = pipe.run()
            jax.block_until_ready(
                jnp.asarray(images.as_array()) if args.cpu else jax.dlpack.from_dlpack(images.as_tensor())
            )
            return args.batch_size

        return one, lambda: None

    def easyfit_input():
        return _easyfit_input(args)

    train_for(1.0)  # compiled
    out: dict = {"model_alone": round(train_for(args.seconds))}
    loads = [None] if args.cpu else [0.0, 0.9, 1.0]
    inputs = [(f"dali hw_decoder_load={load}", functools.partial(raw_input, load)) for load in loads]
    for label, make in [*inputs, ("easyfit_loader", easyfit_input)]:
        one, close = make()
        for _ in range(3):
            one()
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < args.seconds / 2:
            n += one()
        out[label] = {"input_alone": round(n / (time.perf_counter() - t))}
        for depth in (1, 4, 16) if "0.9" in label or label == "easyfit_loader" else (16,):
            input_rate, model_rate = beside(one, functools.partial(train_for, args.seconds, depth))
            out[label][f"model_queue={depth}"] = {"input": round(input_rate), "model": round(model_rate)}
        close()
    return out
