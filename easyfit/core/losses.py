"""Keras loss names -> optax losses, per sample (the train step weights them by the mask); the
loss the labels imply when none is given (:func:`infer_losses`, for one output or each of
several); and the rule by which easyfit calls the functions users give as ``loss=`` or in
``metrics=``.

The rule (:func:`user_function`): Keras' order, ``fn(y_true, y_pred)``, with two exceptions so
that no function is called with its arguments the other way round from what it declares:

* optax's own losses (``optax.softmax_cross_entropy_with_integer_labels``,
  ``optax.sigmoid_binary_cross_entropy``, ..., or a ``functools.partial`` of one) take
  ``(predictions, targets)`` and are called so;
* a function whose first parameter is named like the model's outputs (``y_pred``, ``outputs``,
  ``logits``, ``predictions``, ``preds``) is called outputs first, as its names say.

As Keras does, labels and outputs whose ranks differ by a trailing axis of 1 are first brought to
the same rank (labels ``(n,)`` against outputs ``(n, 1)`` become ``(n, 1)``, not a broadcast
``(n, n)``), and values with more than one per sample are averaged per sample.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = [
    "LossFn",
    "get_loss",
    "infer_loss",
    "infer_losses",
    "is_structured",
    "output_names",
    "user_function",
]

#: ``loss(outputs, labels) -> per-sample losses, shape (batch,)``: easyfit's internal order (a
#: user's function is adapted to it by :func:`user_function`).
LossFn = Callable[[jax.Array, jax.Array], jax.Array]


def is_structured(y: Any) -> bool:
    """Whether labels (or outputs) ``y`` are a dict or a tuple of arrays (several outputs)."""
    return isinstance(y, (Mapping, tuple, list))


def output_names(y: Any) -> dict[Any, str]:
    """``{key: name}`` of each output: a dict's keys, or ``output_<i>`` for a tuple's."""
    if isinstance(y, Mapping):
        return {k: str(k) for k in y}
    return {i: f"output_{i}" for i in range(len(y))}


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
        >>> from easyfit.core.losses import sparse_categorical_crossentropy
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


#: First parameter names that say a function takes the model's outputs first.
_OUTPUTS_FIRST = frozenset(
    {"y_pred", "outputs", "output", "logits", "predictions", "prediction", "preds", "pred"}
)


def _is_optax(fn: Any) -> bool:
    """Whether ``fn`` (or the function a ``functools.partial`` wraps) is optax's own."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    module = getattr(fn, "__module__", None) or ""
    return module == "optax" or module.startswith("optax.")


def outputs_first(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes the model's outputs first: an optax loss, or a function whose first
    positional parameter is named like outputs (see the module's docstring); else it takes the
    labels first, as Keras calls ``fn(y_true, y_pred)``."""
    if _is_optax(fn):
        return True
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read: Keras' order
        return False
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return bool(positional) and positional[0] in _OUTPUTS_FIRST


def same_rank(labels: jax.Array, outputs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Labels and outputs whose ranks differ by a trailing axis of size 1, brought to the same
    rank as Keras does before a loss: a rank-1 side gains the axis, another loses it.

    Example:
        >>> import jax.numpy as jnp
        >>> from easyfit.core.losses import same_rank
        >>> [a.shape for a in same_rank(jnp.zeros(3), jnp.zeros((3, 1)))]
        [(3, 1), (3, 1)]
    """
    if labels.ndim == outputs.ndim + 1 and labels.shape[-1] == 1:
        return (labels, outputs[..., None]) if outputs.ndim == 1 else (labels[..., 0], outputs)
    if outputs.ndim == labels.ndim + 1 and outputs.shape[-1] == 1:
        return (labels[..., None], outputs) if labels.ndim == 1 else (labels, outputs[..., 0])
    return labels, outputs


def user_function(fn: Callable[..., Any], argument: str) -> LossFn:
    """A user's loss or metric function as easyfit calls it, ``(outputs, labels) -> per-sample
    values``: called in the order it takes (:func:`outputs_first`), labels and outputs of the
    same rank, values averaged per sample. One value for the whole batch is a ValueError
    (``argument`` names where it was given): easyfit averages per-sample values over the
    valid rows, and a batch's mean would count its padding rows.

    Example:
        >>> import jax.numpy as jnp
        >>> from easyfit.core.losses import user_function
        >>> def under(y_true, y_pred):  # Keras' order
        ...     return jnp.maximum(y_true - y_pred, 0.0)
        >>> user_function(under, "loss")(jnp.array([[1.0], [5.0]]), jnp.array([3.0, 3.0])).tolist()
        [2.0, 0.0]
    """
    first = outputs_first(fn)
    name = getattr(fn, "__name__", type(fn).__name__)

    def call(outputs: jax.Array, labels: jax.Array) -> jax.Array:
        labels, outputs = same_rank(jnp.asarray(labels), jnp.asarray(outputs))
        values = jnp.asarray(fn(outputs, labels) if first else fn(labels, outputs))
        if values.ndim == 0 or values.shape[0] != outputs.shape[0]:
            raise ValueError(
                f"{argument}: {name} returned shape {values.shape} for a batch of "
                f"{outputs.shape[0]}; return one value per sample (shape ({outputs.shape[0]},)): "
                "easyfit averages them over the valid rows, so that padding never counts"
            )
        return _per_sample(values)

    return call


def get_loss(loss: str | Callable[..., Any]) -> LossFn:
    """A loss by Keras name, or a user's function (Keras' ``fn(y_true, y_pred)``, or an optax
    loss: see :func:`user_function`), as ``(outputs, labels) -> per-sample losses``.

    Models output logits: the cross-entropies apply softmax or sigmoid themselves (Keras'
    ``from_logits=True``).

    Example:
        >>> import jax.numpy as jnp
        >>> from easyfit.core.losses import get_loss
        >>> get_loss("sparse_categorical_crossentropy")(jnp.zeros((2, 4)), jnp.array([0, 3])).shape
        (2,)
    """
    if callable(loss):
        return user_function(loss, "loss")
    try:
        return LOSSES[loss]
    except KeyError:
        raise ValueError(
            f"loss={loss!r}: unknown; expected one of {sorted(LOSSES)}, an optax loss or a "
            "function (y_true, y_pred) -> per-sample losses"
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
        >>> from easyfit.core.losses import infer_loss
        >>> infer_loss(np.dtype("float32"), np.eye(3, dtype=np.float32))[0]
        'categorical_crossentropy'
        >>> infer_loss(np.dtype("float32"), np.array([[0.5], [2.0]]))[0]
        'mse'
    """
    if default is not None:
        return default, "the data source's default for its targets"
    if np.issubdtype(label_dtype, np.integer):
        return "sparse_categorical_crossentropy", "integer labels, read as class indices"
    if labels is not None and _distributions(np.asarray(labels)):
        return "categorical_crossentropy", "float labels whose rows are one-hot or class probabilities"
    return "mse", "float labels that are not one-hot"


def infer_losses(
    loss: Any, y: Any, labels: Any, label_dtype: np.dtype, default: str | None = None
) -> tuple[Any, str | None]:
    """``loss``, or when None the loss inferred from the labels (:func:`infer_loss`, for each
    output of a dict or a tuple), and why (None when it was given).

    Args:
        loss: the loss given, or None.
        y: a first batch's labels (their layout and dtypes).
        labels: every label the source knows, or a first batch's valid rows, in ``y``'s layout.
        label_dtype: the labels' dtype for a single output.
        default: the source's own default loss for a single output (``Source.default_loss``).

    Example:
        >>> import numpy as np
        >>> from easyfit.core.losses import infer_losses
        >>> y = {"kind": np.array([0, 2]), "box": np.ones((2, 4), np.float32)}
        >>> infer_losses(None, y, y, np.dtype(object))[0]
        {'kind': 'sparse_categorical_crossentropy', 'box': 'mse'}
    """
    if loss is not None:
        return loss, None
    if not is_structured(y):
        return infer_loss(label_dtype, labels, default)
    names = output_names(y)
    inferred = {names[k]: infer_loss(np.dtype(y[k].dtype), np.asarray(labels[k]))[0] for k in names}
    why = "inferred from each output's labels"
    return (inferred if isinstance(y, Mapping) else list(inferred.values())), why
