"""Keras loss names -> optax losses, per sample (the train step weights them by the mask)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = ["LossFn", "get_loss", "infer_loss"]

#: ``loss(outputs, labels) -> per-sample losses, shape (batch,)``.
LossFn = Callable[[jax.Array, jax.Array], jax.Array]


def class_indices(labels: jax.Array, outputs: jax.Array) -> jax.Array:
    """Integer labels as one class index per sample: shape ``(batch,)`` or, as Keras accepts
    too, ``(batch, 1)``."""
    if labels.ndim == outputs.ndim and labels.shape[-1] == 1:
        labels = labels[..., 0]
    return labels.astype(jnp.int32)


def _one_hot_like(labels: jax.Array, outputs: jax.Array) -> jax.Array:
    if jnp.issubdtype(labels.dtype, jnp.integer) and (
        labels.ndim == outputs.ndim - 1 or labels.shape[-1] == 1 < outputs.shape[-1]
    ):
        return jax.nn.one_hot(class_indices(labels, outputs), outputs.shape[-1], dtype=outputs.dtype)
    return labels.astype(outputs.dtype)


def _per_sample(values: jax.Array) -> jax.Array:
    return values.reshape(values.shape[0], -1).mean(axis=-1)


def sparse_categorical_crossentropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Softmax cross-entropy of logits against integer class labels. Dense labels (a class per
    pixel: labels ``(batch, H, W)``, logits ``(batch, H, W, classes)``) give each sample the
    mean over its pixels.

    Example:
        >>> import jax.numpy as jnp
        >>> from easyfit.losses import sparse_categorical_crossentropy
        >>> sparse_categorical_crossentropy(jnp.zeros((2, 3, 3, 4)), jnp.zeros((2, 3, 3), int)).shape
        (2,)
    """
    return _per_sample(optax.softmax_cross_entropy_with_integer_labels(logits, class_indices(labels, logits)))


def categorical_crossentropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Softmax cross-entropy against one-hot (or soft) labels; integer labels are one-hot encoded.
    Dense labels give each sample the mean over its pixels."""
    return _per_sample(optax.softmax_cross_entropy(logits, _one_hot_like(labels, logits)))


def binary_crossentropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Sigmoid cross-entropy of logits against 0/1 labels, averaged over outputs."""
    return _per_sample(
        optax.sigmoid_binary_cross_entropy(logits, labels.reshape(logits.shape).astype(logits.dtype))
    )


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
        raise ValueError(
            f"loss={loss!r}: unknown; expected one of {sorted(LOSSES)} or a "
            "callable (outputs, labels) -> per-sample losses"
        ) from None


def _distributions(labels: np.ndarray) -> bool:
    """Whether every row is one-hot or a probability distribution over more than one class."""
    rows = labels.reshape(len(labels), -1) if labels.ndim >= 2 else None
    return (
        rows is not None
        and len(rows) > 0
        and rows.shape[1] > 1
        and bool((rows >= 0).all())
        and np.allclose(rows.sum(axis=1), 1.0, atol=1e-3)
    )


def infer_loss(
    label_dtype: np.dtype, labels: np.ndarray | None, default: str | None = None
) -> tuple[str, str]:
    """The loss to use when none was given, from the labels, and why (a line for the log).

    Integer labels are class indices (one per sample, or one per pixel for segmentation masks):
    sparse categorical cross-entropy. Float labels whose rows
    are one-hot (or class probabilities): categorical cross-entropy. Other float labels:
    mean squared error.

    Args:
        label_dtype: the labels' dtype.
        labels: every label, or a first batch's; None if unknown.
        default: the source's ``default_loss``, which wins when given (an ``ImageCSV``'s
            targets are regression targets even where each row sums to 1).

    Example:
        >>> import numpy as np
        >>> from easyfit.losses import infer_loss
        >>> infer_loss(np.dtype("float32"), np.eye(3, dtype=np.float32))[0]
        'categorical_crossentropy'
        >>> infer_loss(np.dtype("float32"), np.array([[0.5], [2.0]]))[0]
        'mse'
    """
    if default is not None:
        return default, "the data source's default for its targets"
    if np.issubdtype(label_dtype, np.integer):
        return "sparse_categorical_crossentropy", "integer labels (class indices)"
    if labels is not None and _distributions(np.asarray(labels)):
        return "categorical_crossentropy", "float labels whose rows are one-hot or class probabilities"
    return "mse", "float labels that are not one-hot"
