"""Pure step functions, and their jitted multi-step forms.

``make_train_step`` gives the pure core: ``train_step(state, batch) -> (state, metrics)``, with
``metrics`` a clu Collection of that batch. ``compile_*`` wrap the steps for the trainer: one
jitted function runs a whole *chunk* (``steps_per_execution`` steps, one ``lax.scan``), merges
metrics into an accumulator that stays on the device, and donates its input buffers.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import optax
from clu import metrics as clu_metrics
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ..parallel import DATA_AXIS, Placement
from .models import ModelAdapter
from .precision import Precision
from .state import TrainState, inference_params

if TYPE_CHECKING:
    from .sharding import StateLayout

__all__ = [
    "Compiled",
    "batch_metrics",
    "compile_eval",
    "compile_predict",
    "compile_train",
    "forward",
    "make_eval_step",
    "make_infer",
    "make_train_step",
    "masked_mean",
    "per_dispatch",
    "prepare_inputs",
    "trains",
    "weighted",
    "with_ema",
]

#: ``{"x", "y", "mask"}`` and, when given, ``"sample_weight"``; ``x`` and ``y`` may be dicts or
#: tuples of arrays (structured arrays).
Batch = dict[str, Any]
#: ``loss(outputs, batch) -> per-sample losses``: ``Trainer.compute_loss``, traced in the steps.
BatchLoss = Callable[[Any, Batch], jax.Array]


def prepare_inputs(x: Any, scale: float | None, dtype: Any = jnp.float32) -> Any:
    """Model inputs from what DALI delivered: times ``scale`` (1/255 for 8-bit images), in
    ``dtype`` (the precision's compute dtype); every array of a dict or tuple of inputs. An
    integer input without a scale (token ids, counts) becomes float32, never a 16-bit compute
    dtype, which would round it (257 is 256 in bfloat16): the model casts it back exactly."""

    def one(a: jax.Array) -> jax.Array:
        if scale is not None:
            a = a.astype(jnp.float32) * scale
        elif jnp.issubdtype(a.dtype, jnp.integer):
            return a.astype(jnp.float32)
        return a.astype(dtype)

    return jax.tree_util.tree_map(one, x)


def _forward(
    adapter: ModelAdapter,
    precision: Precision,
    params: Any,
    model_state: Any,
    x: jax.Array,
    train: bool,
    rng: jax.Array | None = None,
) -> tuple[Any, Any]:
    """The model in the precision's compute dtype: float32 outputs, and a model state in the
    dtypes it came in."""
    out, new_state = adapter.apply(precision.cast(params), model_state, x, train, rng)
    return precision.to_float32(out), precision.like(new_state, model_state)


def forward(
    adapter: ModelAdapter,
    precision: Precision,
    scale: float | None,
    params: Any,
    model_state: Any,
    x: Any,
    train: bool,
    rng: jax.Array | None = None,
) -> tuple[Any, Any]:
    """``(outputs, model_state)`` of the model on a batch's ``x`` as the input pipeline
    delivers it (times ``scale``, in the precision's compute dtype); float32 outputs."""
    x = prepare_inputs(x, scale, precision.compute_dtype)
    return _forward(adapter, precision, params, model_state, x, train, rng)


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean of per-sample ``values`` over the valid rows (``mask``): padding counts zero."""
    w = mask.astype(values.dtype)
    return jnp.sum(values * w) / jnp.maximum(jnp.sum(w), 1.0)


def weighted(per_sample: jax.Array, batch: Batch, class_weight: Any = None) -> jax.Array:
    """Per-sample losses times the batch's ``sample_weight`` (when it has them) and, given
    ``class_weight`` (a weight per class index), the weight of each sample's class.

    The mean over the valid rows of what this returns is the loss (Keras' reduction,
    ``"sum_over_batch_size"``: ``sum(w * loss) / rows``; a sample of weight 0 adds nothing but
    still counts as a row).
    """
    if class_weight is not None:  # a class past the table's last key weighs 1.0, as in Keras
        classes, n = _class_index(batch["y"]), class_weight.shape[0]
        known = (classes >= 0) & (classes < n)
        per_sample = per_sample * jnp.where(known, class_weight[jnp.clip(classes, 0, n - 1)], 1.0)
    if "sample_weight" in batch:
        per_sample = per_sample * batch["sample_weight"]
    return per_sample


def batch_metrics(metrics: type[clu_metrics.Collection], outputs: Any, batch: Batch, loss: jax.Array) -> Any:
    """The metrics of one batch: ``metrics`` (a clu Collection) from the model's ``outputs``,
    the batch (labels, mask, sample weights) and the per-sample ``loss``."""
    extra = {"sample_weight": batch["sample_weight"]} if "sample_weight" in batch else {}
    return metrics.single_from_model_output(
        outputs=outputs, logits=outputs, labels=batch["y"], loss=loss, mask=batch["mask"], **extra
    )


def make_train_step(
    adapter: ModelAdapter,
    tx: optax.GradientTransformation,
    loss_fn: BatchLoss,
    metrics: type[clu_metrics.Collection],
    scale: float | None,
    precision: Precision = Precision(),
    class_weight: Any = None,
) -> Callable[[TrainState, Batch], Any]:
    """The pure train step: gradients of the masked mean loss, one optimizer update.

    ``class_weight``: a weight per class index (an array), multiplying each sample's loss, as
    Keras' ``class_weight`` (training only); so does the batch's ``sample_weight`` when it has
    one (see :func:`weighted`); padding rows still count zero.

    Under ``precision`` the pass runs in its compute dtype on float32 master parameters; with
    loss scaling (float16) a step whose gradients are not finite leaves the parameters, the
    optimizer state and the model state as they were, and only the scale changes.
    """

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Any]:
        x = prepare_inputs(batch["x"], scale, precision.compute_dtype)
        mask = batch["mask"]
        rng = jax.random.fold_in(state.rng, state.step)

        def objective(params):
            out, model_state = _forward(adapter, precision, params, state.model_state, x, True, rng)
            per_sample = weighted(loss_fn(out, batch), batch, class_weight)
            return masked_mean(per_sample, mask), (out, per_sample, model_state)

        if state.dynamic_scale is not None:
            dynamic_scale, finite, (_, aux), grads = state.dynamic_scale.value_and_grad(
                objective, has_aux=True
            )(state.params)
        else:
            grads, aux = jax.grad(objective, has_aux=True)(state.params)
        out, per_sample, model_state = aux
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        new = state.replace(
            step=state.step + 1,
            params=optax.apply_updates(state.params, updates),
            opt_state=opt_state,
            model_state=model_state,
        )
        if state.dynamic_scale is not None:
            kept = state.replace(step=state.step + 1)
            new = jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, kept)
            new = new.replace(dynamic_scale=dynamic_scale)
        return new, batch_metrics(metrics, out, batch, per_sample)

    return train_step


def with_ema(
    train_step: Callable[[TrainState, Batch], Any], momentum: float, accumulation: int | None = None
) -> Callable[[TrainState, Batch], Any]:
    """``train_step`` followed by an update of the parameters' moving average
    (``state.ema_params``), on the device, as Keras' ``use_ema``: after every batch,
    ``ema = momentum * ema + (1 - momentum) * params``, except that while no optimizer update
    had been made before the batch (the first one, or the first ``accumulation`` batches with
    gradient accumulation) the momentum is 0 and the average becomes the parameters.

    It wraps any train step (an override of ``Trainer.train_step`` too) and leaves a state
    without ``ema_params`` as it is. ``state.step`` counts batches; optimizer updates are
    ``step // accumulation``.
    """
    every = accumulation or 1

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, Any]:
        new, metrics = train_step(state, batch)
        if state.ema_params is None:
            return new, metrics
        rate = jnp.where(state.step // every == 0, 1.0, 1.0 - momentum)  # 1 - Keras' momentum
        return new.replace(ema_params=optax.incremental_update(new.params, state.ema_params, rate)), metrics

    return step


def _class_index(y: jax.Array) -> jax.Array:
    """Class indices, as Keras finds them: the argmax of one-hot rows (integer or float), else
    the label rounded (class indices of shape (n,) or (n, 1), 0/1 labels of a binary output);
    ValueError for dense labels (a class per pixel), which have no one class per sample."""
    if y.ndim > 2:
        raise ValueError(
            f"class_weight: labels of shape {y.shape[1:]} per sample have no one class per "
            "sample (segmentation masks?); weight the loss per pixel by overriding "
            "Trainer.compute_loss instead"
        )
    if y.ndim == 2 and y.shape[-1] > 1:
        return jnp.argmax(y, axis=-1)
    y = y.reshape(y.shape[0])
    return y if jnp.issubdtype(y.dtype, jnp.integer) else jnp.round(y).astype(jnp.int32)


def make_eval_step(
    adapter: ModelAdapter,
    loss_fn: BatchLoss,
    metrics: type[clu_metrics.Collection],
    scale: float | None,
    precision: Precision = Precision(),
) -> Callable[[TrainState, Batch], Any]:
    """The pure evaluation step: metrics of one batch, padding rows excluded (the loss times
    the batch's ``sample_weight`` when it has one; ``class_weight`` is for training only)."""

    def eval_step(state: TrainState, batch: Batch) -> Any:
        x = prepare_inputs(batch["x"], scale, precision.compute_dtype)
        out, _ = _forward(adapter, precision, inference_params(state), state.model_state, x, False)
        return batch_metrics(metrics, out, batch, weighted(loss_fn(out, batch), batch))

    return eval_step


def _unfold(placement: Placement, k: int, chunk: Batch) -> Batch:
    """(shards*k*b, ...) shard-major rows -> (k, shards*b, ...): one batch per step."""
    n = placement.num_shards

    def one(a: jax.Array) -> jax.Array:
        b = a.shape[0] // (n * k)
        a = a.reshape((n, k, b) + a.shape[1:]).swapaxes(0, 1).reshape((k, n * b) + a.shape[1:])
        spec = P(None, DATA_AXIS, *([None] * (a.ndim - 2)))
        return jax.lax.with_sharding_constraint(a, NamedSharding(placement.mesh, spec))

    return jax.tree_util.tree_map(one, chunk)  # every array: x and y may be dicts or tuples


def _scan(body: Callable, carry: Any, steps: Batch, k: int) -> tuple[Any, Any]:
    """``lax.scan(body, carry, steps)``; for one step a plain call, since XLA's CPU backend runs
    convolutions several times slower inside a loop (even one of a single iteration)."""
    if k > 1:
        return jax.lax.scan(body, carry, steps)
    carry, out = body(carry, jax.tree_util.tree_map(lambda v: v[0], steps))
    return carry, jax.tree_util.tree_map(lambda a: a[None], out)


def compile_train(
    train_step: Callable,
    placement: Placement,
    k: int,
    steps: int | None = None,
    layout: StateLayout | None = None,
) -> jax.stages.Wrapped:
    """``(state, acc, chunk) -> (state, acc)``: a chunk of k steps' rows, its first ``steps``
    steps (all k by default) trained in one dispatch.

    An epoch's last chunk has fewer steps to train than rows for (``Plan.live_steps``); the
    rest, padding, is sliced off inside the compiled function rather than skipped step by step:
    a ``lax.cond`` per step costs XLA's GPU backend a host round trip each time
    (docs/performance.md).

    The state comes back replicated, or with a sharded ``layout`` (``easyfit.core.sharding``)
    placed as the layout says, as the next dispatch takes it.
    """
    used = k if steps is None else steps

    def run(state: TrainState, acc: Any, chunk: Batch) -> tuple[TrainState, Any]:
        def body(carry, batch):
            state, m = train_step(carry[0], batch)
            return (state, carry[1].merge(m)), None

        batches = _unfold(placement, k, chunk)
        if used < k:
            batches = jax.tree_util.tree_map(lambda a: a[:used], batches)
        (state, acc), _ = _scan(body, (state, acc), batches, used)
        return (state, acc) if layout is None else (layout.constrain(state), acc)

    rep = placement.replicated
    if layout is not None and layout.sharded:  # the state's shardings: the constraint's
        return jax.jit(run, donate_argnums=(0, 1), out_shardings=(None, rep))
    layout = None
    return jax.jit(run, donate_argnums=(0, 1), out_shardings=(rep, rep))


def compile_eval(eval_step: Callable, placement: Placement, k: int) -> Callable:
    """``(state, acc, chunk) -> acc``."""

    def run(state: TrainState, acc: Any, chunk: Batch) -> Any:
        def body(acc, batch):
            return acc.merge(eval_step(state, batch)), None

        return _scan(body, acc, _unfold(placement, k, chunk), k)[0]

    return jax.jit(run, donate_argnums=(1,), out_shardings=placement.replicated)


def make_infer(
    adapter: ModelAdapter, scale: float | None, precision: Precision = Precision()
) -> Callable[[TrainState, jax.Array], Any]:
    """The pure inference function: ``(state, x) -> outputs`` in evaluation mode, ``x`` as the
    input pipeline delivers it (prediction and ``Trainer.export`` share it)."""

    def infer(state: TrainState, x: jax.Array) -> Any:
        x = prepare_inputs(x, scale, precision.compute_dtype)
        return _forward(adapter, precision, inference_params(state), state.model_state, x, False)[0]

    return infer


def compile_predict(
    adapter: ModelAdapter,
    scale: float | None,
    placement: Placement,
    k: int,
    precision: Precision = Precision(),
) -> Callable:
    """``(state, chunk) -> (outputs, mask)``, each ``(k, batch, ...)`` in step-major order."""
    infer = make_infer(adapter, scale, precision)

    def run(state: TrainState, chunk: Batch) -> tuple[jax.Array, jax.Array]:
        steps = _unfold(placement, k, chunk)

        def body(_, batch):
            return None, infer(state, batch["x"])

        return _scan(body, None, steps, k)[1], steps["mask"]

    return jax.jit(run)


#: Samples per dispatch that ``steps_per_execution="auto"`` aims at on GPUs, streaming from DALI
#: and from the device cache (the measurements behind them: docs/performance.md).
STREAMED_SAMPLES, CACHED_SAMPLES = 6_000, 12_800


def per_dispatch(
    steps_per_execution: int | str,
    num_samples: int,
    batch_size: int,
    platform: str,
    cached: bool,
    epoch_steps: int | None = None,
) -> int:
    """Optimizer steps per dispatch: ``steps_per_execution``, or for ``"auto"`` about
    :data:`STREAMED_SAMPLES` samples per dispatch when streaming and :data:`CACHED_SAMPLES`
    from the device cache (GPUs: enough to keep them busy between dispatches), never more
    than an epoch (``epoch_steps`` steps, or a pass over the data); on CPUs one step, as XLA
    runs convolutions slower inside a scan. Fewer, down to half, when that many divide the
    epoch's steps: its last dispatch then needs no function of its own (one compilation less).

    Example:
        >>> from easyfit.core.steps import per_dispatch
        >>> per_dispatch("auto", 60_000, 200, "gpu", False)  # 300 steps, 30 per dispatch
        30
        >>> per_dispatch("auto", 60_000, 200, "gpu", True)  # 64 wanted; 60 divides 300
        60
        >>> per_dispatch("auto", 22_680, 256, "gpu", False)  # 89 steps: 23, then 20 left
        23
    """
    if steps_per_execution != "auto":
        return int(steps_per_execution)
    steps = epoch_steps or -(-num_samples // batch_size)
    wanted = 1 if platform == "cpu" else round((CACHED_SAMPLES if cached else STREAMED_SAMPLES) / batch_size)
    k = min(steps, max(1, wanted))
    return next((d for d in range(k, k // 2, -1) if steps % d == 0), k)


@dataclasses.dataclass(frozen=True)
class Compiled:
    """The jitted functions of one configuration (loss, metrics, input scale, chunk size);
    ``train(n)`` trains a chunk's first n steps (``trains``)."""

    train: Callable[[int], jax.stages.Wrapped]
    eval: Callable
    metrics: type[clu_metrics.Collection]


def trains(
    train_step: Callable, placement: Placement, k: int, layout: StateLayout | None = None
) -> Callable[[int], jax.stages.Wrapped]:
    """``n -> `` the jitted function that trains the first n steps of a chunk of k (n = k but
    for an epoch's last chunk; ``compile_train``), one per n, made when first asked for."""

    @functools.cache
    def train(n: int) -> jax.stages.Wrapped:
        return compile_train(train_step, placement, k, n, layout)

    return train
