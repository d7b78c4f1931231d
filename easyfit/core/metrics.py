"""Keras metric names -> clu metrics, merged on the device inside the jitted steps.

A metric function is called as Keras calls it, ``fn(y_true, y_pred) -> per-sample values`` (the
exceptions, for optax's functions and those named outputs first: ``easyfit.core.losses``). A clu
metric class receives the model outputs as keyword arguments: ``outputs`` (also as ``logits``,
the name clu's own metrics such as ``clu.metrics.Accuracy`` read), ``labels``, ``loss``
(per-sample losses), ``mask`` (False for padding rows, which never count) and, when the data
has them, ``sample_weight``. For a model with several outputs, :func:`for_output` gives a
metric one output and its labels, and :func:`output_loss` averages one output's loss. Keras'
classification metrics (``"auc"``, ``"f1_score"``, ``ef.metrics.MeanIoU(3)``, ...) are made in
``easyfit.core.keras_metrics`` for the loss and labels of their output.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from clu import metrics as clu_metrics
from flax import struct

from .keras_metrics import KERAS_NAMES, KerasMetric, activation_of
from .learning_rate import get_learning_rate
from .losses import user_function

__all__ = [
    "build_collection",
    "compute_on_host",
    "default_metrics",
    "epoch_logs",
    "for_output",
    "output_loss",
]


def _true_class(outputs: jax.Array, labels: jax.Array) -> jax.Array:
    """Class indices from sparse labels (shape ``(batch,)`` or ``(batch, 1)``) or one-hot ones."""
    if labels.ndim == outputs.ndim and labels.shape[-1] == 1:
        return labels[..., 0]
    return labels.argmax(-1) if labels.ndim == outputs.ndim else labels


def _class_of(outputs: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Predicted and true classes, for sparse, one-hot and binary labels (one per sample, or
    one per pixel: outputs ``(batch, H, W, classes)``)."""
    if outputs.shape[-1] == 1 or outputs.ndim == 1:
        pred = ((outputs[..., 0] if outputs.ndim > 1 else outputs) > 0).astype(jnp.int32)
        return pred, (labels.reshape(pred.shape) > 0.5).astype(jnp.int32)
    pred = outputs.argmax(-1)
    return pred, _true_class(outputs, labels).astype(pred.dtype)


def _sample_mean(values: jax.Array) -> jax.Array:
    """Per-sample values: the mean over a sample's pixels when there is one value per pixel
    (a per-pixel metric; images of one size weigh every pixel alike)."""
    return values.reshape(values.shape[0], -1).mean(-1) if values.ndim > 1 else values


def _accuracy(outputs: jax.Array, labels: jax.Array, **_: Any) -> jax.Array:
    pred, true = _class_of(outputs, labels)
    return _sample_mean((pred == true).astype(jnp.float32))


def _top_k(k: int) -> Callable[..., jax.Array]:
    def top_k_accuracy(outputs: jax.Array, labels: jax.Array, **_: Any) -> jax.Array:
        true = _true_class(outputs, labels)
        true_score = jnp.take_along_axis(outputs, true.astype(jnp.int32)[..., None], -1)
        return _sample_mean(((outputs > true_score).sum(-1) < k).astype(jnp.float32))

    return top_k_accuracy


def _error(power: int) -> Callable[..., jax.Array]:
    def error(outputs: jax.Array, labels: jax.Array, **_: Any) -> jax.Array:
        d = outputs - labels.reshape(outputs.shape).astype(outputs.dtype)
        d = d * d if power == 2 else jnp.abs(d)
        return d.reshape(d.shape[0], -1).mean(-1)

    return error


_BY_NAME: dict[str, Callable[..., jax.Array]] = {
    "accuracy": _accuracy,
    "acc": _accuracy,
    "top_k_accuracy": _top_k(5),
    "sparse_top_k_categorical_accuracy": _top_k(5),
    "top_k_categorical_accuracy": _top_k(5),
    "mse": _error(2),
    "mean_squared_error": _error(2),
    "mae": _error(1),
    "mean_absolute_error": _error(1),
}


def _from_values(fn: Callable[..., jax.Array]) -> type[clu_metrics.Metric]:
    """A masked average of ``fn(outputs, labels)``'s per-sample values."""

    def values(
        outputs: jax.Array, labels: jax.Array, mask: jax.Array | None = None, **_: Any
    ) -> dict[str, jax.Array | None]:
        return {"values": fn(outputs=outputs, labels=labels), "mask": mask}

    return clu_metrics.Average.from_fun(values)


#: Which way each named metric improves (Keras' ``_direction``), for ``mode="auto"``.
_DIRECTIONS = {
    "accuracy": "up",
    "acc": "up",
    "top_k_accuracy": "up",
    "sparse_top_k_categorical_accuracy": "up",
    "top_k_categorical_accuracy": "up",
    "mse": "down",
    "mean_squared_error": "down",
    "mae": "down",
    "mean_absolute_error": "down",
}


def _resolve(metric: Any, loss: Any = None, labels: Any = None) -> tuple[str, type[clu_metrics.Metric]]:
    """``(name, metric class)``, the class carrying the direction the metric declares (Keras'
    ``_direction``: a named metric's, or a custom one's own attribute) for ``mode="auto"``.
    ``loss`` and ``labels`` (the output's loss and labels, or their shapes) are what Keras'
    metrics (``easyfit.core.keras_metrics``) are made for."""
    if isinstance(metric, str) and metric in KERAS_NAMES:
        metric = KERAS_NAMES[metric]()
    if isinstance(metric, type) and issubclass(metric, KerasMetric):
        metric = metric()
    if isinstance(metric, KerasMetric):
        cls = metric.metric_class(activation_of(loss), labels)
        cls._direction = metric._direction  # type: ignore[attr-defined]  # a class made for it
        return metric.name, cls
    name, cls = _resolve_metric(metric)
    direction = _DIRECTIONS.get(metric) if isinstance(metric, str) else getattr(metric, "_direction", None)
    if direction is not None and getattr(cls, "_direction", None) != direction:
        cls._direction = direction  # type: ignore[attr-defined]  # a class made for this metric
    return name, cls


def _resolve_metric(metric: Any) -> tuple[str, type[clu_metrics.Metric]]:
    if isinstance(metric, str):
        if metric not in _BY_NAME:
            raise ValueError(
                f"metrics: unknown metric {metric!r}; expected one of "
                f"{sorted({*_BY_NAME, *KERAS_NAMES})}, an ef.metrics object, a callable or a clu "
                "Metric class"
            )
        return metric, _from_values(_BY_NAME[metric])
    if isinstance(metric, type) and issubclass(metric, clu_metrics.Metric):
        return metric.__name__.lower(), metric
    if callable(metric):
        name = getattr(metric, "__name__", type(metric).__name__)
        return name, _from_values(user_function(metric, f"metrics ({name})"))
    raise ValueError(f"metrics: cannot use {metric!r} as a metric")


def _select(tree: Any, key: Any) -> Any:
    """Output (or labels) ``key`` of a model with several outputs."""
    if not isinstance(tree, (Mapping, tuple, list)):
        raise ValueError(
            f"metrics: a metric of output {key!r} got a single array; the model must return a "
            "dict or a tuple of outputs, as y is"
        )
    return tree[key]


def for_output(
    key: Any, metric: Any, loss: Any = None, labels: Any = None
) -> tuple[str, type[clu_metrics.Metric]]:
    """``(name, metric class)`` of ``metric`` (a name, a callable or a clu Metric class) on one
    output of a model with several (a dict or a tuple of outputs): it is given that output
    (``outputs``, ``logits``) and its labels, as a single-output model's metric is.

    Example:
        >>> import jax.numpy as jnp
        >>> from easyfit.core.metrics import for_output
        >>> name, Acc = for_output("kind", "accuracy")
        >>> m = Acc.from_model_output(outputs={"kind": jnp.array([[2.0, 0.0], [2.0, 0.0]])},
        ...                           labels={"kind": jnp.array([0, 1])}, mask=None)
        >>> name, float(m.compute())
        ('accuracy', 0.5)
    """
    name, resolved = _resolve(metric, loss, labels)

    @struct.dataclass
    class ForOutput(resolved):  # type: ignore[valid-type,misc]
        @classmethod
        def from_model_output(cls, outputs: Any, labels: Any, **kwargs: Any) -> Any:
            kwargs.pop("logits", None)
            out = _select(outputs, key)
            return super().from_model_output(outputs=out, logits=out, labels=_select(labels, key), **kwargs)

    return name, ForOutput


def output_loss(key: Any, loss_fn: Callable[[Any, Any], jax.Array]) -> type[clu_metrics.Metric]:
    """The mean of one output's loss (Keras' ``<output>_loss``): ``loss_fn`` on output ``key``
    and its labels, times the sample weights, over the valid rows; not multiplied by the
    output's loss weight (as Keras records it)."""

    def values(
        outputs: Any, labels: Any, mask: jax.Array | None = None, sample_weight: Any = None, **_: Any
    ) -> dict[str, jax.Array | None]:
        v = loss_fn(_select(outputs, key), _select(labels, key))
        return {"values": v if sample_weight is None else v * sample_weight, "mask": mask}

    return clu_metrics.Average.from_fun(values)


#: Losses of classification, for which accuracy is reported by default (Keras reports none).
_CLASSIFICATION = ("sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy")


def default_metrics(metrics: Any, loss: Any) -> Any:
    """The metrics asked for, or by default accuracy for a classification loss."""
    if metrics is not None:
        return metrics
    return ["accuracy"] if loss in _CLASSIFICATION else []


def build_collection(
    metrics: Sequence[Any] | Mapping[str, Any] | None, loss: Any = None, labels: Any = None
) -> type[clu_metrics.Collection]:
    """A clu Collection with ``loss`` and the requested metrics.

    Args:
        metrics: Keras names (``"accuracy"``, ``"top_k_accuracy"``, ``"mse"``, ``"mae"``,
            ``"auc"``, ``"precision"``, ``"recall"``, ``"f1_score"``, ...), Keras' metric objects
            of ``easyfit.metrics`` (``AUC(num_thresholds=200)``, ``MeanIoU(num_classes=3)``, ...),
            functions ``(y_true, y_pred) -> per-sample values`` (averaged over valid samples;
            see ``easyfit.core.losses.user_function``),
            clu ``Metric`` classes (given ``outputs``/``logits``, ``labels``, ``loss``, ``mask``), or a dict
            of any of those by name.
        loss: the loss the model is trained with: it says which activation turns the outputs
            into the probabilities Keras' threshold metrics read (``keras_metrics.activation_of``).
        labels: the labels (or their shapes and dtypes): ``F1Score`` counts its classes from them.

    Example:
        >>> import jax.numpy as jnp
        >>> from easyfit.core.metrics import build_collection
        >>> Metrics = build_collection(["accuracy"])
        >>> m = Metrics.single_from_model_output(
        ...     outputs=jnp.array([[2.0, 0.0], [2.0, 0.0]]), labels=jnp.array([0, 1]),
        ...     loss=jnp.array([0.1, 0.3]), mask=jnp.array([True, False]))
        >>> {k: round(float(v), 3) for k, v in sorted(m.compute().items())}
        {'accuracy': 1.0, 'loss': 0.1}
    """
    items = (
        list(metrics.items())
        if isinstance(metrics, Mapping)
        else [_resolve(m, loss, labels) for m in (metrics or [])]
    )
    fields = {"loss": clu_metrics.Average.from_output("loss")}
    for name, metric in items:
        if isinstance(metrics, Mapping):
            metric = _resolve(metric, loss, labels)[1]
        if name == "loss":
            raise ValueError("metrics: 'loss' is always reported; do not list it")
        if name in fields:
            raise ValueError(
                f"metrics: two metrics are named {name!r}; give one another name "
                "(ef.metrics.AUC(curve='PR', name='pr_auc'))"
            )
        fields[name] = metric
    return clu_metrics.Collection.create(**fields)


#: ``compute()`` jitted, one function per collection class. Collections made by
#: ``Collection.create`` share one class name and often one shape, so a single jit shared by them
#: could hand one collection the cached computation of another (with the other's metric names).
#: Kept here, not on clu's classes; weak keys, so a collection class no longer used is dropped.
_COMPUTE: weakref.WeakKeyDictionary[type, Callable[[Any], dict[str, jax.Array]]] = weakref.WeakKeyDictionary()


def _metric_values(acc: Any) -> dict[str, jax.Array]:
    """``acc.compute()``, through the jitted function of its collection class."""
    cls = type(acc)
    compute = _COMPUTE.get(cls)
    if compute is None:
        compute = _COMPUTE[cls] = jax.jit(lambda a: a.compute())
    return compute(acc)


def compute_on_host(acc: Any) -> dict[str, float]:
    """The values of a clu metric collection on the host, in field order (loss first, as
    Keras), computed in one jitted call rather than op by op (each eager op compiles on a GPU).
    A metric of several values (``F1Score(average=None)``: one per class) is logged as
    ``<name>_0``, ``<name>_1``, ..., the logs holding numbers only.
    """
    values = jax.device_get(_metric_values(acc))
    logs: dict[str, float] = {}
    for name in [f.name for f in dataclasses.fields(acc) if f.name in values]:
        value = np.asarray(values[name])
        if value.size == 1:
            logs[name] = float(value.reshape(()))
        else:
            logs.update({f"{name}_{i}": float(v) for i, v in enumerate(value.reshape(-1))})
    return logs


def epoch_logs(acc: Any, state: Any) -> dict[str, float]:
    """An epoch's logs: its metrics, the learning rate (when the optimizer exposes it) and the
    float16 loss scale (when there is one)."""
    logs = compute_on_host(acc)
    learning_rate = get_learning_rate(state.opt_state)
    if learning_rate is not None:
        logs["learning_rate"] = learning_rate
    if state.dynamic_scale is not None:
        logs["loss_scale"] = float(jax.device_get(state.dynamic_scale.scale))
    return logs
