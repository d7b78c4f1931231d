"""The training state: one small immutable pytree."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from .models import example_input

__all__ = ["TrainState", "create_state", "inference_params"]


@struct.dataclass
class TrainState:
    """Everything training changes, and nothing else (no functions: it checkpoints as arrays).

    Attributes:
        step: optimizer steps taken.
        params: the trainable parameters.
        opt_state: the optimizer's state.
        model_state: the model's other variables (linen collections such as ``batch_stats``;
            for NNX, every non-parameter variable).
        rng: the key dropout and other randomness in the train step derive from (folded with
            the step, so it never needs to change).
        dynamic_scale: the loss scale under ``precision="float16"`` (a Flax ``DynamicScale``),
            else None.
        ema_params: the exponential moving average of ``params`` under
            ``Trainer(ema_momentum=)`` (``easyfit.training.steps.with_ema``), else None: what
            evaluation, prediction and export use (:func:`inference_params`).
    """

    step: jax.Array
    params: Any
    opt_state: Any
    model_state: Any
    rng: jax.Array
    dynamic_scale: Any = None
    ema_params: Any = None

    if TYPE_CHECKING:  # added by flax.struct.dataclass

        def replace(self, **updates: Any) -> TrainState: ...


def create_state(
    adapter: Any,
    tx: optax.GradientTransformation,
    seed: int,
    shape: Any,
    nnx_variables: Any = None,
    abstract: bool = False,
    dynamic_scale: Any = None,
    ema: bool = False,
) -> TrainState:
    """A fresh TrainState for inputs of ``shape`` (one sample's); with ``abstract``, its shapes
    and dtypes only, computing nothing.

    Args:
        adapter: the model's ``easyfit.training.models.ModelAdapter``.
        tx: the optimizer.
        seed: seeds the initialisation (linen) and the training RNG key.
        shape: one input sample's shape (a dict or list of shapes for several inputs: see
            ``easyfit.training.models.input_spec``).
        nnx_variables: an NNX model's ``(params, model_state)``, copied: the train step donates
            the state's buffers, never the user's.
        abstract: return ``jax.ShapeDtypeStruct`` leaves instead of arrays.
        dynamic_scale: the loss scale (``precision="float16"``), or None.
        ema: keep a moving average of the parameters (``ema_params``), starting as a copy of
            them.
    """
    init_rng, train_rng = jax.random.split(jax.random.PRNGKey(seed))
    if adapter.kind == "nnx":
        params, model_state = jax.tree_util.tree_map((lambda a: a) if abstract else jnp.copy, nnx_variables)
    else:
        sample = example_input(shape)
        init = functools.partial(jax.eval_shape, adapter.init) if abstract else jax.jit(adapter.init)
        params, model_state = init(init_rng, sample)
    opt_state = (jax.eval_shape if abstract else lambda f, p: f(p))(tx.init, params)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=opt_state,
        model_state=model_state,
        rng=train_rng,
        dynamic_scale=dynamic_scale,
        ema_params=jax.tree_util.tree_map((lambda a: a) if abstract else jnp.copy, params) if ema else None,
    )


def inference_params(state: TrainState) -> Any:
    """The parameters evaluation, prediction and export use: the moving average
    (``ema_params``) when the state keeps one, else ``params``."""
    return state.params if state.ema_params is None else state.ema_params
