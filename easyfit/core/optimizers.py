"""Keras optimizer names -> optax optimizers, with Keras 3's defaults.

``Trainer(model, optimizer="adam")`` works as ``model.compile(optimizer="adam")`` does in Keras:
the name stands for the optimizer with Keras' default settings. Each is built with
``optax.inject_hyperparams``, so its learning rate shows in the epoch logs and
``ReduceLROnPlateau`` / ``LearningRateScheduler`` can change it.

| name | optax optimizer (Keras 3's defaults) |
|------|--------------------------------------|
| ``adam`` | ``optax.adam(1e-3, b1=0.9, b2=0.999, eps=1e-7)`` |
| ``sgd`` | ``optax.sgd(1e-2)`` |
| ``rmsprop`` | ``optax.rmsprop(1e-3, decay=0.9, eps=1e-7)`` (epsilon inside the square root) |
| ``adamw`` | ``optax.adamw(1e-3, b1=0.9, b2=0.999, eps=1e-7, weight_decay=0.004)`` |
| ``adagrad`` | ``optax.adagrad(1e-3, initial_accumulator_value=0.1, eps=1e-7)`` |

Keras' Adam (and AdamW) adds its epsilon to the square root of the uncorrected second moment
("epsilon hat"), optax to that of the bias-corrected one: the updates differ only where that
root is of the order of epsilon, i.e. for tiny gradients. For other settings, pass an optax
optimizer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optax

__all__ = ["KERAS_DEFAULTS", "accumulating", "get_optimizer"]

#: Keras 3's defaults, as optax constructors and their keyword arguments.
KERAS_DEFAULTS: dict[str, tuple[Callable[..., optax.GradientTransformation], dict[str, Any]]] = {
    "adam": (optax.adam, {"learning_rate": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-7}),
    "sgd": (optax.sgd, {"learning_rate": 1e-2}),
    "rmsprop": (optax.rmsprop, {"learning_rate": 1e-3, "decay": 0.9, "eps": 1e-7}),
    "adamw": (
        optax.adamw,
        {"learning_rate": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-7, "weight_decay": 0.004},
    ),
    "adagrad": (optax.adagrad, {"learning_rate": 1e-3, "initial_accumulator_value": 0.1, "eps": 1e-7}),
}


def get_optimizer(optimizer: str | optax.GradientTransformation | None) -> optax.GradientTransformation:
    """An optax optimizer: by Keras name (with Keras' defaults), as given, or the default.

    Args:
        optimizer: ``"adam"``, ``"sgd"``, ``"rmsprop"``, ``"adamw"``, ``"adagrad"`` (any case),
            an optax ``GradientTransformation``, or None for ``optax.adam(1e-3)``.

    Raises:
        ValueError: an unknown name (the message lists the known ones), or something that is
            no optimizer.

    Example:
        >>> import jax.numpy as jnp
        >>> from easyfit.core.learning_rate import get_learning_rate
        >>> from easyfit.core.optimizers import get_optimizer
        >>> tx = get_optimizer("sgd")
        >>> round(get_learning_rate(tx.init({"w": jnp.zeros(2)})), 6)
        0.01
        >>> get_optimizer("adamax")
        Traceback (most recent call last):
        ...
        ValueError: optimizer='adamax': unknown name; expected one of 'adam', 'sgd', ...
    """
    if optimizer is None:
        return optax.adam(1e-3)
    if isinstance(optimizer, str):
        try:
            make, kwargs = KERAS_DEFAULTS[optimizer.lower()]
        except KeyError:
            known = ", ".join(repr(n) for n in KERAS_DEFAULTS)
            raise ValueError(
                f"optimizer={optimizer!r}: unknown name; expected one of {known}, "
                "or an optax optimizer such as optax.adam(1e-3)"
            ) from None
        return optax.inject_hyperparams(make)(**kwargs)
    if _nnx_optimizer(optimizer):
        raise ValueError(
            "optimizer=nnx.Optimizer(...): pass the optax transformation instead, e.g. "
            "optimizer=optax.adam(1e-3), not the nnx.Optimizer (easyfit keeps the optimizer state)"
        )
    if not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))):
        shown = repr(optimizer)
        shown = shown if len(shown) <= 80 and "\n" not in shown else f"<{type(optimizer).__qualname__}>"
        raise ValueError(
            f"optimizer={shown}: expected a Keras optimizer name or an optax "
            "GradientTransformation (with init and update), e.g. optax.adam(1e-3)"
        )
    return optimizer


def _nnx_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is Flax's ``nnx.Optimizer`` (what the NNX tutorials build), which
    holds its own state and model: easyfit takes the optax transformation inside it."""
    try:
        from flax import nnx
    except ImportError:  # pragma: no cover - flax is a dependency
        return False
    return isinstance(optimizer, nnx.Optimizer)


def accumulating(tx: optax.GradientTransformation, steps: int | None) -> optax.GradientTransformation:
    """``tx`` applied once every ``steps`` calls to the mean of those calls' gradients
    (``optax.MultiSteps``; ``Trainer(gradient_accumulation_steps=)``), or ``tx`` itself for
    None.

    The accumulated gradients and the count of calls live in the optimizer state, so a
    checkpoint taken mid-accumulation resumes it exactly. Between updates the parameters stay
    as they are (the update is zero) and the inner optimizer's state, learning-rate schedule
    included, does not move: a schedule counts optimizer updates, not batches.

    Raises:
        ValueError: ``steps`` is not None or an integer >= 2 (Keras' rule).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from easyfit.core.optimizers import accumulating
        >>> tx = accumulating(optax.sgd(1.0), 2)
        >>> params = {"w": jnp.zeros(())}
        >>> state = tx.init(params)
        >>> u1, state = tx.update({"w": jnp.array(1.0)}, state)
        >>> u2, state = tx.update({"w": jnp.array(3.0)}, state)
        >>> float(u1["w"]), float(u2["w"])  # nothing, then minus the mean gradient
        (0.0, -2.0)
    """
    if steps is None:
        return tx
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(
            f"gradient_accumulation_steps={steps!r}: expected an integer >= 2, or None for "
            "an update every batch"
        )
    return optax.MultiSteps(tx, every_k_schedule=steps).gradient_transformation()
