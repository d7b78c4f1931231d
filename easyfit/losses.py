"""Keras loss names -> optax losses, per sample (the train step weights them by the mask)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

__all__ = ["LossFn", "get_loss"]

#: ``loss(outputs, labels) -> per-sample losses, shape (batch,)``.
LossFn = Callable[[jax.Array, jax.Array], jax.Array]


def _one_hot_like(labels: jax.Array, outputs: jax.Array) -> jax.Array:
    if labels.ndim == outputs.ndim - 1 and jnp.issubdtype(labels.dtype, jnp.integer):
        return jax.nn.one_hot(labels, outputs.shape[-1], dtype=outputs.dtype)
    return labels.astype(outputs.dtype)


def _per_sample(values: jax.Array) -> jax.Array:
    return values.reshape(values.shape[0], -1).mean(axis=-1)


def sparse_categorical_crossentropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Softmax cross-entropy of logits against integer class labels."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels.astype(jnp.int32))


def categorical_crossentropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Softmax cross-entropy against one-hot (or soft) labels; integer labels are one-hot encoded."""
    return optax.softmax_cross_entropy(logits, _one_hot_like(labels, logits))


def binary_crossentropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Sigmoid cross-entropy of logits against 0/1 labels, averaged over outputs."""
    return _per_sample(optax.sigmoid_binary_cross_entropy(
        logits, labels.reshape(logits.shape).astype(logits.dtype)))


def mean_squared_error(outputs: jax.Array, labels: jax.Array) -> jax.Array:
    """Squared error averaged over outputs."""
    return _per_sample(optax.squared_error(outputs, labels.reshape(outputs.shape).astype(outputs.dtype)))


def mean_absolute_error(outputs: jax.Array, labels: jax.Array) -> jax.Array:
    """Absolute error averaged over outputs."""
    return _per_sample(jnp.abs(outputs - labels.reshape(outputs.shape).astype(outputs.dtype)))


LOSSES: dict[str, LossFn] = {
    "sparse_categorical_crossentropy": sparse_categorical_crossentropy,
    "categorical_crossentropy": categorical_crossentropy,
    "binary_crossentropy": binary_crossentropy,
    "mse": mean_squared_error,
    "mean_squared_error": mean_squared_error,
    "mae": mean_absolute_error,
    "mean_absolute_error": mean_absolute_error,
}


def get_loss(loss: str | LossFn) -> LossFn:
    """A loss by Keras name, or a callable ``(outputs, labels) -> per-sample losses``.

    Models output logits: the cross-entropies apply softmax or sigmoid themselves (Keras'
    ``from_logits=True``).

    Example:
        >>> import jax.numpy as jnp
        >>> from easyfit.losses import get_loss
        >>> get_loss("sparse_categorical_crossentropy")(jnp.zeros((2, 4)), jnp.array([0, 3])).shape
        (2,)
    """
    if callable(loss):
        return loss
    try:
        return LOSSES[loss]
    except KeyError:
        raise ValueError(f"loss={loss!r}: unknown; expected one of {sorted(LOSSES)} or a "
                         "callable (outputs, labels) -> per-sample losses") from None
