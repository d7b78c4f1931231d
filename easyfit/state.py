"""The training state: one small immutable pytree."""

from __future__ import annotations

from typing import Any

import jax
from flax import struct

__all__ = ["TrainState"]


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
    """

    step: jax.Array
    params: Any
    opt_state: Any
    model_state: Any
    rng: jax.Array
    dynamic_scale: Any = None
