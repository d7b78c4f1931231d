"""The recipe that benchmarks/imagenet.py times, in its parts: the models and train step of
``examples/imagenet_resnet.py`` in plain JAX, the training pipeline as DALI's ResNet-50
examples write it, and easyfit's source for the same recipe.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def example():
    """examples/imagenet_resnet.py as a module (its models and recipe)."""
    spec = importlib.util.spec_from_file_location(
        "imagenet_resnet", HERE.parent / "examples" / "imagenet_resnet.py"
    )
    if spec.name not in sys.modules:  # registered first: flax's dataclasses look it up
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def as_linen(model):
    """``(init, apply)`` with linen's signatures for the example's NNX model, so that the plain
    JAX loops below run it as a pure function: ``init(key, x, train=False)`` gives
    ``{"params", "batch_stats"}``, ``apply(variables, x, train, mutable=...)`` as linen's."""
    from flax import nnx

    graphdef, params, stats = nnx.split(model, nnx.Param, nnx.BatchStat)

    def init(key, x, train=False):
        return {"params": params, "batch_stats": stats}

    def apply(variables, x, train=False, mutable=()):
        m = nnx.merge(graphdef, variables["params"], variables["batch_stats"], copy=True)  # this trace's
        m.train() if train else m.eval()
        out = m(x)
        return (out, {"batch_stats": nnx.state(m, nnx.BatchStat)}) if mutable else out

    return init, apply


def recipe_source(args):
    """The recipe's training source (random resized crop, flip, ImageNet normalisation), with
    ``--hw-load`` applied to easyfit's decoder setting when given."""
    import easyfit as ef

    if args.hw_load is not None:
        ef.data.images.HW_DECODER_LOAD = args.hw_load
    aug = ef.data.Augment(random_resized_crop=(0.08, 1.0), flip=True)
    side = getattr(args, "image_size", 224)
    return ef.data.ImageFolder(
        os.path.join(args.root, "train"), image_size=(side, side), augment=aug, normalize="imagenet"
    )


def model_step(name: str, classes: int, batch: int, width: int = 64, size: int = 224):
    """(state, jitted train step, jitted correct-count) of the recipe, plain JAX: bf16 passes on
    float32 weights (``width`` and ``size``, the image side, smaller only for smoke runs)."""
    import jax
    import jax.numpy as jnp
    import optax

    ex = example()
    init, apply = as_linen({"resnet18": ex.resnet18, "resnet50": ex.resnet50}[name](classes, width))
    variables = jax.jit(lambda x: init(jax.random.PRNGKey(0), x, train=False))(jnp.zeros((1, size, size, 3)))
    params, stats = variables["params"], variables["batch_stats"]
    tx = ex.optimizer(batch, 100, 90)

    def loss_fn(p, stats, x, y):
        p16 = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), p)
        out, new = apply(
            {"params": p16, "batch_stats": stats}, x.astype(jnp.bfloat16), train=True, mutable=["batch_stats"]
        )
        out = out.astype(jnp.float32)
        return ex.smoothed_cross_entropy(out, y).mean(), (new["batch_stats"], out)

    def step(state, x, y):
        p, o, stats = state
        (loss, (stats, out)), g = jax.value_and_grad(loss_fn, has_aux=True)(p, stats, x, y)
        updates, o = tx.update(g, o, p)
        correct = jnp.sum(jnp.argmax(out, -1) == y)
        return (optax.apply_updates(p, updates), o, stats), loss, correct

    def correct(state, x, y):
        p, _, stats = state
        p16 = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), p)
        out = apply({"params": p16, "batch_stats": stats}, x.astype(jnp.bfloat16), train=False)
        return jnp.sum(jnp.argmax(out, -1) == y)

    return (params, tx.init(params), stats), jax.jit(step, donate_argnums=0), jax.jit(correct)


def train_pipeline(
    root: str,
    batch: int,
    threads: int,
    device_id,
    hw_load: float | None,
    shuffle_reader: bool = True,
    size: int = 224,
):
    """The recipe's training pipeline, written as DALI's ResNet-50 examples do (``size``: the
    crops' side)."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=device_id, seed=0)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=shuffle_reader, name="reader")
        kwargs = {} if hw_load is None else {"hw_decoder_load": hw_load}
        images = fn.decoders.image_random_crop(
            jpegs,
            device="mixed" if device_id is not None else "cpu",
            output_type=types.RGB,
            random_area=[0.08, 1.0],
            random_aspect_ratio=[3 / 4, 4 / 3],
            **kwargs,
        )
        images = fn.resize(images, size=[size, size])
        images = fn.crop_mirror_normalize(
            images, mirror=fn.random.coin_flip(), mean=MEAN, std=STD, dtype=types.FLOAT16, output_layout="HWC"
        )
        return images, labels.gpu() if device_id is not None else labels

    return pipe()
