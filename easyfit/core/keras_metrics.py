"""Keras' classification metrics by name and as objects, computed on the device.

Each object (``AUC``, ``Precision``, ``Recall``, ``F1Score``, ``MeanIoU``, the accuracies,
``Hinge``) holds Keras' arguments and makes, for one output's loss and labels, a clu metric
class whose state is sums: confusion counts per threshold or per class (AUC, precision,
recall, F1, IoU), or a masked average of per-sample values (accuracies, hinge). Sums merge by
addition, within a dispatch's steps and over the devices alike, with no transfer to the host.

Models output logits; Keras' metrics read probabilities. Where the probability matters
(thresholds: ``AUC``, ``Precision``, ``Recall``, ``F1Score``, ``BinaryAccuracy``), the outputs
go through the activation the loss implies: sigmoid for ``binary_crossentropy``, softmax for
the categorical cross-entropies and, for another loss, sigmoid on one column and softmax on
several. ``from_logits=False`` takes the outputs as probabilities, as Keras does. Labels that
are class indices against outputs of several columns are one-hot encoded first. Counts are
unweighted (as Keras' ``metrics=``; ``sample_weight`` weighs the loss) and padding rows never
count. Counts are kept exactly as integers, in two int32 words each.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from clu import metrics as clu_metrics
from flax import struct

__all__ = [
    "AUC",
    "BinaryAccuracy",
    "CategoricalAccuracy",
    "F1Score",
    "Hinge",
    "KERAS_NAMES",
    "KerasMetric",
    "MeanIoU",
    "Precision",
    "Recall",
    "SparseCategoricalAccuracy",
    "SparseTopKCategoricalAccuracy",
    "TopKCategoricalAccuracy",
    "activation_of",
]

_EPSILON = 1e-7  # Keras' backend.epsilon()
_LOW_BITS = 20  # a count is hi * 2**20 + lo, 0 <= lo < 2**20: exact far past int32's range


def activation_of(loss: Any) -> str | None:
    """The activation that turns the outputs into the probabilities ``loss`` implies:
    ``"sigmoid"``, ``"softmax"``, or None when the loss does not say (one column: sigmoid;
    several: softmax)."""
    name = loss if isinstance(loss, str) else getattr(getattr(loss, "func", loss), "__name__", "")
    if name in ("binary_crossentropy", "sigmoid_binary_cross_entropy"):
        return "sigmoid"
    if name in ("sparse_categorical_crossentropy", "categorical_crossentropy") or name.startswith(
        "softmax_cross_entropy"
    ):
        return "softmax"
    return None


# ------------------------------------------------------------------------ outputs and labels
def _columns(outputs: jax.Array) -> int:
    return 1 if outputs.ndim == 1 else int(outputs.shape[-1])


def _probabilities(outputs: jax.Array, activation: str | None, from_logits: bool) -> jax.Array:
    outputs = outputs.astype(jnp.float32)
    if not from_logits:
        return outputs
    if activation == "softmax" or (activation is None and _columns(outputs) > 1):
        return jax.nn.softmax(outputs, axis=-1)
    return jax.nn.sigmoid(outputs)


def _is_index(labels: jax.Array, outputs: jax.Array) -> bool:
    """Whether integer ``labels`` are class indices of ``outputs`` of several columns."""
    return (
        _columns(outputs) > 1
        and jnp.issubdtype(labels.dtype, jnp.integer)
        and (labels.ndim == outputs.ndim - 1 or (labels.ndim == outputs.ndim and labels.shape[-1] == 1))
    )


def _dense_labels(labels: jax.Array, outputs: jax.Array) -> jax.Array:
    """Labels in the outputs' shape: class indices one-hot encoded, ``(n,)`` against ``(n, 1)``
    given the trailing axis."""
    if _is_index(labels, outputs):
        index = labels[..., 0] if labels.ndim == outputs.ndim else labels
        return jax.nn.one_hot(index, outputs.shape[-1], dtype=jnp.float32)
    if labels.size != outputs.size:
        raise ValueError(
            f"metrics: labels of shape {labels.shape} do not match outputs of shape {outputs.shape}"
        )
    return labels.reshape(outputs.shape).astype(jnp.float32)


def _row_mask(mask: jax.Array | None, like: jax.Array) -> jax.Array:
    """The rows' mask broadcast over every entry of ``like`` (rows first), as 0/1 int32."""
    if mask is None:
        return jnp.ones(like.shape, jnp.int32)
    m = mask.astype(jnp.int32).reshape((like.shape[0],) + (1,) * (like.ndim - 1))
    return jnp.broadcast_to(m, like.shape)


def _predicted_class(outputs: jax.Array) -> jax.Array:
    """The class each output picks: the argmax of several columns, logit > 0 for one."""
    if _columns(outputs) == 1:
        return ((outputs[..., 0] if outputs.ndim > 1 else outputs) > 0).astype(jnp.int32)
    return outputs.argmax(-1).astype(jnp.int32)


def _true_class(labels: jax.Array, outputs: jax.Array) -> jax.Array:
    """Class indices from index labels, one-hot rows or 0/1 labels of one column."""
    if _columns(outputs) == 1:
        return (labels.reshape(outputs.shape[: max(outputs.ndim - 1, 1)]) > 0.5).astype(jnp.int32)
    if jnp.issubdtype(labels.dtype, jnp.integer):
        return (labels[..., 0] if labels.ndim == outputs.ndim else labels).astype(jnp.int32)
    return labels.argmax(-1).astype(jnp.int32)


# ----------------------------------------------------------------------------- exact counts
def _split(count: jax.Array) -> tuple[jax.Array, jax.Array]:
    return count >> _LOW_BITS, count & ((1 << _LOW_BITS) - 1)


def _value(hi: jax.Array, lo: jax.Array) -> jax.Array:
    return hi.astype(jnp.float32) * float(1 << _LOW_BITS) + lo.astype(jnp.float32)


@struct.dataclass
class _Counts(clu_metrics.Metric):
    """Integer counts (named arrays), summed exactly; ``_metric`` computes from them."""

    hi: dict[str, jax.Array]
    lo: dict[str, jax.Array]

    _metric: ClassVar[Any] = None
    _activation: ClassVar[str | None] = None

    @classmethod
    def empty(cls) -> _Counts:
        shapes = cls._metric.shapes()  # distinct arrays: the steps donate the state's buffers
        return cls(
            hi={k: jnp.zeros(s, jnp.int32) for k, s in shapes.items()},
            lo={k: jnp.zeros(s, jnp.int32) for k, s in shapes.items()},
        )

    @classmethod
    def from_model_output(  # type: ignore[override]
        cls, outputs: jax.Array, labels: jax.Array, mask: jax.Array | None = None, **_: Any
    ) -> _Counts:
        counts = cls._metric.counts(outputs, labels, mask, cls._activation)
        split = {k: _split(v.astype(jnp.int32)) for k, v in counts.items()}
        return cls(hi={k: v[0] for k, v in split.items()}, lo={k: v[1] for k, v in split.items()})

    def merge(self, other: _Counts) -> _Counts:
        hi, lo = {}, {}
        for k in self.lo:
            carry, low = _split(self.lo[k] + other.lo[k])
            hi[k], lo[k] = self.hi[k] + other.hi[k] + carry, low
        return type(self)(hi=hi, lo=lo)

    def compute(self) -> jax.Array:
        return self._metric.result({k: _value(self.hi[k], self.lo[k]) for k in self.lo})


def _masked_average(fn: Any) -> type[clu_metrics.Metric]:
    def values(
        outputs: jax.Array, labels: jax.Array, mask: jax.Array | None = None, **_: Any
    ) -> dict[str, jax.Array | None]:
        v = fn(outputs, labels, mask)
        return {"values": v.reshape(v.shape[0], -1).mean(-1) if v.ndim > 1 else v, "mask": mask}

    return clu_metrics.Average.from_fun(values)


# ------------------------------------------------------------------------------- the objects
class KerasMetric:
    """A Keras metric's arguments; :meth:`metric_class` makes its clu metric for an output."""

    name: str
    _direction: str = "up"

    def metric_class(self, activation: str | None, labels: Any) -> type[clu_metrics.Metric]:
        """The clu metric class for an output whose loss implies ``activation``, labels laid
        out like ``labels`` (an array or its shape and dtype)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class _CountMetric(KerasMetric):
    def shapes(self) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    def counts(
        self, outputs: jax.Array, labels: jax.Array, mask: jax.Array | None, activation: str | None
    ) -> dict[str, jax.Array]:
        raise NotImplementedError

    def result(self, counts: dict[str, jax.Array]) -> jax.Array:
        raise NotImplementedError

    def metric_class(self, activation: str | None, labels: Any) -> type[clu_metrics.Metric]:
        @struct.dataclass
        class Counts(_Counts):
            pass

        Counts._metric, Counts._activation = self, activation
        Counts.__name__ = Counts.__qualname__ = type(self).__name__
        return Counts


def _divide_no_nan(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.where(b == 0, 0.0, a / jnp.where(b == 0, 1.0, b))


def _check_thresholds(thresholds: Sequence[float], argument: str) -> list[float]:
    values = [float(t) for t in thresholds]
    if any(not 0.0 <= t <= 1.0 for t in values):
        raise ValueError(f"{argument}: thresholds must lie in [0, 1]; got {values}")
    return values


class AUC(_CountMetric):
    """Keras' ``AUC``: the area under the ROC (or PR) curve, a Riemann sum over
    ``num_thresholds`` thresholds evenly spaced in [0, 1] (or ``thresholds``), with Keras'
    ``summation_method``. ``multi_label=True`` computes one AUC per label (``num_labels``
    columns) and averages them. ``from_logits`` (True here: models output logits) applies the
    loss's activation first."""

    def __init__(
        self,
        num_thresholds: int = 200,
        curve: str = "ROC",
        summation_method: str = "interpolation",
        name: str = "auc",
        thresholds: Sequence[float] | None = None,
        multi_label: bool = False,
        num_labels: int | None = None,
        from_logits: bool = True,
    ):
        if curve.upper() not in ("ROC", "PR"):
            raise ValueError(f"AUC: curve={curve!r}; expected 'ROC' or 'PR'")
        if summation_method not in ("interpolation", "minoring", "majoring"):
            raise ValueError(
                f"AUC: summation_method={summation_method!r}; expected 'interpolation', "
                "'minoring' or 'majoring'"
            )
        if thresholds is not None:
            inner = sorted(_check_thresholds(thresholds, "AUC"))
        else:
            if num_thresholds <= 1:
                raise ValueError(f"AUC: num_thresholds={num_thresholds}; must be an integer > 1")
            inner = [(i + 1) / (num_thresholds - 1) for i in range(num_thresholds - 2)]
        if multi_label and not num_labels:
            raise ValueError("AUC: multi_label=True needs num_labels (the number of label columns)")
        if num_labels and not multi_label:
            raise ValueError("AUC: num_labels is needed only when multi_label=True")
        self.num_thresholds = len(inner) + 2
        self.curve = curve.upper()
        self.summation_method = summation_method
        self.name = name
        self.thresholds = [-_EPSILON, *inner, 1.0 + _EPSILON]
        self._evenly = thresholds is None
        self.multi_label = multi_label
        self.num_labels = num_labels
        self.from_logits = from_logits

    def shapes(self) -> dict[str, tuple[int, ...]]:
        shape = (self.num_thresholds, self.num_labels or 1) if self.multi_label else (self.num_thresholds,)
        return dict.fromkeys(("tp", "fp", "tn", "fn"), shape)

    def counts(
        self, outputs: jax.Array, labels: jax.Array, mask: jax.Array | None, activation: str | None
    ) -> dict[str, jax.Array]:
        pred = _probabilities(outputs, activation, self.from_logits)
        true = _dense_labels(labels, outputs) != 0
        valid = _row_mask(mask, pred)
        if self.multi_label:
            if pred.ndim != 2 or pred.shape[-1] != self.num_labels:
                raise ValueError(
                    f"AUC: multi_label=True takes outputs of shape (batch, {self.num_labels}); "
                    f"got {pred.shape}"
                )
        else:
            pred, true, valid = pred.reshape(-1, 1), true.reshape(-1, 1), valid.reshape(-1, 1)
        pos = (true & (valid > 0)).astype(jnp.int32)
        neg = (~true & (valid > 0)).astype(jnp.int32)
        n = self.num_thresholds
        if self._evenly:  # a bucket per prediction, then a reversed cumulative sum (Keras' way)
            bucket = jnp.maximum(jnp.ceil(jnp.clip(pred, 0.0, 1.0) * (n - 1)) - 1, 0).astype(jnp.int32)
            labels_n = pred.shape[-1]
            ids = (bucket * labels_n + jnp.arange(labels_n, dtype=jnp.int32)).reshape(-1)

            def above(counts: jax.Array) -> jax.Array:
                per_bucket = jax.ops.segment_sum(counts.reshape(-1), ids, num_segments=n * labels_n)
                return jnp.cumsum(per_bucket.reshape(n, labels_n)[::-1], axis=0)[::-1]

            tp, fp = above(pos), above(neg)
        else:
            over = pred[None] > jnp.asarray(self.thresholds, jnp.float32)[:, None, None]
            tp, fp = (over * pos[None]).sum(1), (over * neg[None]).sum(1)
        tn, fn = neg.sum(0)[None] - fp, pos.sum(0)[None] - tp
        out = {"tp": tp, "fp": fp, "tn": tn, "fn": fn}
        return out if self.multi_label else {k: v[:, 0] for k, v in out.items()}

    def result(self, c: dict[str, jax.Array]) -> jax.Array:
        tp, fp, tn, fn = c["tp"], c["fp"], c["tn"], c["fn"]
        if self.curve == "PR" and self.summation_method == "interpolation":
            terms = self._pr_interpolation(tp, fp, fn)
        else:
            recall = _divide_no_nan(tp, tp + fn)
            if self.curve == "ROC":
                x, y = _divide_no_nan(fp, fp + tn), recall
            else:
                x, y = recall, _divide_no_nan(tp, tp + fp)
            if self.summation_method == "interpolation":
                heights = (y[:-1] + y[1:]) / 2.0
            elif self.summation_method == "minoring":
                heights = jnp.minimum(y[:-1], y[1:])
            else:
                heights = jnp.maximum(y[:-1], y[1:])
            terms = (x[:-1] - x[1:]) * heights
        return terms.sum(0).mean() if self.multi_label else terms.sum()

    @staticmethod
    def _pr_interpolation(tp: jax.Array, fp: jax.Array, fn: jax.Array) -> jax.Array:
        """Davis & Goadrich's interpolation of precision between thresholds (Keras')."""
        dtp = tp[:-1] - tp[1:]
        p = tp + fp
        dp = p[:-1] - p[1:]
        slope = _divide_no_nan(dtp, jnp.maximum(dp, 0))
        intercept = tp[1:] - slope * p[1:]
        ratio = jnp.where((p[:-1] > 0) & (p[1:] > 0), _divide_no_nan(p[:-1], jnp.maximum(p[1:], 0)), 1.0)
        return _divide_no_nan(slope * (dtp + intercept * jnp.log(ratio)), jnp.maximum(tp[1:] + fn[1:], 0))


class _PrecisionRecall(_CountMetric):
    """Precision's and Recall's arguments and counts; ``_NAME`` is the default ``name``."""

    _NAME: ClassVar[str]

    def __init__(
        self,
        thresholds: float | Sequence[float] | None = None,
        top_k: int | None = None,
        class_id: int | None = None,
        name: str | None = None,
        from_logits: bool = True,
    ):
        kind = type(self).__name__
        if thresholds is None:
            values = [0.5] if top_k is None else [float("-inf")]
        else:
            many = thresholds if isinstance(thresholds, Sequence) else [thresholds]
            values = _check_thresholds(many, kind)
        if top_k is not None and top_k < 1:
            raise ValueError(f"{kind}: top_k={top_k}; must be >= 1")
        self.thresholds = thresholds
        self.top_k = top_k
        self.class_id = class_id
        self.name = self._NAME if name is None else name
        self.from_logits = from_logits
        self._values = values

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict.fromkeys(("tp", "fp", "fn"), (len(self._values),))

    def counts(
        self, outputs: jax.Array, labels: jax.Array, mask: jax.Array | None, activation: str | None
    ) -> dict[str, jax.Array]:
        pred = _probabilities(outputs, activation, self.from_logits)
        true = _dense_labels(labels, outputs) != 0
        valid = _row_mask(mask, pred) > 0
        if self.top_k is not None:  # only the k highest of each row may be positive
            top = jax.lax.top_k(pred, min(self.top_k, pred.shape[-1]))[1]
            kept = jax.nn.one_hot(top, pred.shape[-1], dtype=jnp.int32).sum(-2) > 0
            pred = jnp.where(kept, pred, -jnp.inf)
        if self.class_id is not None:
            if pred.ndim < 2 or not 0 <= self.class_id < pred.shape[-1]:
                raise ValueError(
                    f"{type(self).__name__}: class_id={self.class_id} for outputs of shape {pred.shape}"
                )
            pred, true, valid = pred[..., self.class_id], true[..., self.class_id], valid[..., self.class_id]
        above = pred.reshape(1, -1) > jnp.asarray(self._values, jnp.float32)[:, None]
        true, valid = true.reshape(1, -1), valid.reshape(1, -1)
        return {
            "tp": (above & true & valid).sum(1),
            "fp": (above & ~true & valid).sum(1),
            "fn": (~above & true & valid).sum(1),
        }

    def _single(self, values: jax.Array) -> jax.Array:
        return values[0] if len(self._values) == 1 else values


class Precision(_PrecisionRecall):
    """Keras' ``Precision``: ``tp / (tp + fp)`` of the predictions above ``thresholds`` (0.5;
    a list gives one value per threshold), over every entry of the outputs, or only the top
    ``top_k`` of each row, or only column ``class_id``."""

    _NAME = "precision"

    def result(self, c: dict[str, jax.Array]) -> jax.Array:
        return self._single(_divide_no_nan(c["tp"], c["tp"] + c["fp"]))


class Recall(_PrecisionRecall):
    """Keras' ``Recall``: ``tp / (tp + fn)``, with ``Precision``'s arguments."""

    _NAME = "recall"

    def result(self, c: dict[str, jax.Array]) -> jax.Array:
        return self._single(_divide_no_nan(c["tp"], c["tp"] + c["fn"]))


class F1Score(_CountMetric):
    """Keras' ``F1Score`` (``FBetaScore`` with ``beta=1``): per class from the counts of the
    whole epoch; ``average`` None (one value per class), ``"micro"``, ``"macro"`` or
    ``"weighted"`` (by each class's true count). A prediction is the row's highest
    probability, or with ``threshold`` every probability above it. ``num_classes`` (not
    Keras') is needed only for labels given as class indices: Keras takes one-hot labels,
    whose columns give it."""

    def __init__(
        self,
        average: str | None = None,
        threshold: float | None = None,
        name: str = "f1_score",
        beta: float = 1.0,
        num_classes: int | None = None,
        from_logits: bool = True,
    ):
        if average not in (None, "micro", "macro", "weighted"):
            raise ValueError(f"F1Score: average={average!r}; expected None, 'micro', 'macro' or 'weighted'")
        if threshold is not None and not 0.0 < threshold <= 1.0:
            raise ValueError(f"F1Score: threshold={threshold}; must satisfy 0 < threshold <= 1")
        if beta <= 0:
            raise ValueError(f"F1Score: beta={beta}; must be > 0")
        self.average = average
        self.threshold = threshold
        self.name = name
        self.beta = float(beta)
        self.num_classes = num_classes
        self.from_logits = from_logits
        self._classes = num_classes

    def metric_class(self, activation: str | None, labels: Any) -> type[clu_metrics.Metric]:
        classes = self.num_classes
        if classes is None and labels is not None:
            integer = jnp.issubdtype(labels.dtype, jnp.integer)
            if not integer or activation == "sigmoid":
                classes = int(labels.shape[-1]) if len(labels.shape) >= 2 else 1
        if classes is None:
            given = "are class indices, which do not say" if labels is not None else "are unknown: they say"
            raise ValueError(
                f"metrics: {self.name}: the labels {given} how many classes there are (Keras' "
                "F1Score takes one-hot labels); pass ef.metrics.F1Score(num_classes=N, ...)"
            )
        made = F1Score(self.average, self.threshold, self.name, self.beta, classes, self.from_logits)
        return _CountMetric.metric_class(made, activation, labels)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        shape: tuple[int, ...] = () if self.average == "micro" else (self._classes or 1,)
        return dict.fromkeys(("tp", "fp", "fn", "support"), shape)

    def counts(
        self, outputs: jax.Array, labels: jax.Array, mask: jax.Array | None, activation: str | None
    ) -> dict[str, jax.Array]:
        if _columns(outputs) != self._classes:
            raise ValueError(
                f"metrics: {self.name}: outputs of shape {outputs.shape} for {self._classes} classes"
            )
        pred = _probabilities(outputs, activation, self.from_logits)
        true = _dense_labels(labels, outputs) != 0
        pred, true = pred.reshape(-1, self._classes), true.reshape(-1, self._classes)
        valid = _row_mask(mask, outputs).reshape(-1, self._classes) > 0
        if self.threshold is None:
            chosen = (pred >= pred.max(-1, keepdims=True)) & (jnp.abs(pred) > 1e-9)
        else:
            chosen = pred > self.threshold
        axis = None if self.average == "micro" else 0
        return {
            "tp": (chosen & true & valid).sum(axis),
            "fp": (chosen & ~true & valid).sum(axis),
            "fn": (~chosen & true & valid).sum(axis),
            "support": (true & valid).sum(axis),
        }

    def result(self, c: dict[str, jax.Array]) -> jax.Array:
        precision = c["tp"] / (c["tp"] + c["fp"] + _EPSILON)
        recall = c["tp"] / (c["tp"] + c["fn"] + _EPSILON)
        b2 = self.beta**2
        f = (1 + b2) * precision * recall / (b2 * precision + recall + _EPSILON)
        if self.average == "weighted":
            return (f * c["support"] / (c["support"].sum() + _EPSILON)).sum()
        return f.mean() if self.average is not None else f


class MeanIoU(_CountMetric):
    """Keras' ``MeanIoU``: the intersection over union of each of ``num_classes`` classes from
    the epoch's confusion matrix, averaged over the classes that occur (in labels or
    predictions); ``ignore_class`` leaves a label out. The predicted class is the outputs'
    (the argmax of several columns, logit > 0 of one), the true class the labels' (indices or
    one-hot)."""

    def __init__(self, num_classes: int, name: str = "mean_iou", ignore_class: int | None = None):
        if num_classes < 1:
            raise ValueError(f"MeanIoU: num_classes={num_classes}; must be >= 1")
        self.num_classes = num_classes
        self.name = name
        self.ignore_class = ignore_class

    def shapes(self) -> dict[str, tuple[int, ...]]:
        n = max(self.num_classes, 2)  # one column of outputs picks class 0 or 1
        return {"cm": (n, n)}

    def counts(
        self, outputs: jax.Array, labels: jax.Array, mask: jax.Array | None, activation: str | None
    ) -> dict[str, jax.Array]:
        pred, true = _predicted_class(outputs), _true_class(labels, outputs)
        valid = _row_mask(mask, true) > 0
        n = max(self.num_classes, 2)
        keep = valid & (true >= 0) & (true < self.num_classes) & (pred >= 0) & (pred < self.num_classes)
        if self.ignore_class is not None:
            keep = keep & (true != self.ignore_class)
        cell = jnp.where(keep, true * n + pred, n * n).reshape(-1)
        return {"cm": jnp.bincount(cell, length=n * n + 1)[: n * n].reshape(n, n)}

    def result(self, c: dict[str, jax.Array]) -> jax.Array:
        cm = c["cm"][: self.num_classes, : self.num_classes]
        tp = jnp.diag(cm)
        denominator = cm.sum(0) + cm.sum(1) - tp
        valid = denominator > 1e-9
        iou = jnp.where(valid, tp / (denominator + _EPSILON), 0.0)
        return iou.sum() / (valid.sum() + _EPSILON)


class _Average(KerasMetric):
    def values(
        self, outputs: jax.Array, labels: jax.Array, mask: jax.Array | None, activation: str | None
    ) -> jax.Array:
        raise NotImplementedError

    def metric_class(self, activation: str | None, labels: Any) -> type[clu_metrics.Metric]:
        return _masked_average(functools.partial(self.values, activation=activation))


class BinaryAccuracy(_Average):
    """Keras' ``BinaryAccuracy``: the share of entries whose probability is above ``threshold``
    exactly where the label is 1."""

    def __init__(self, name: str = "binary_accuracy", threshold: float = 0.5, from_logits: bool = True):
        self.name = name
        self.threshold = threshold
        self.from_logits = from_logits

    def values(
        self, outputs: jax.Array, labels: jax.Array, mask: jax.Array | None, activation: str | None
    ) -> jax.Array:
        pred = _probabilities(outputs, activation, self.from_logits)
        true = _dense_labels(labels, outputs)
        return (true == (pred > self.threshold).astype(jnp.float32)).astype(jnp.float32)


class CategoricalAccuracy(_Average):
    """Keras' ``CategoricalAccuracy``: whether the argmax of the outputs is that of the one-hot
    labels."""

    def __init__(self, name: str = "categorical_accuracy"):
        self.name = name

    def values(
        self, outputs: jax.Array, labels: jax.Array, mask: jax.Array | None, activation: str | None
    ) -> jax.Array:
        return (outputs.argmax(-1) == _true_class(labels, outputs)).astype(jnp.float32)


class SparseCategoricalAccuracy(CategoricalAccuracy):
    """Keras' ``SparseCategoricalAccuracy``: whether the argmax of the outputs is the label's
    class index (the same values: the labels' class is found from either layout)."""

    def __init__(self, name: str = "sparse_categorical_accuracy"):
        super().__init__(name)


class SparseTopKCategoricalAccuracy(_Average):
    """Keras' ``SparseTopKCategoricalAccuracy``: whether the label's class is among the ``k``
    highest outputs (a tie with the k-th counts as in)."""

    def __init__(self, k: int = 5, name: str = "sparse_top_k_categorical_accuracy"):
        self.k = k
        self.name = name

    def _index(self, outputs: jax.Array, labels: jax.Array) -> jax.Array:
        return labels[..., 0] if labels.ndim == outputs.ndim else labels

    def values(
        self, outputs: jax.Array, labels: jax.Array, mask: jax.Array | None, activation: str | None
    ) -> jax.Array:
        index = self._index(outputs, labels).astype(jnp.int32)
        score = jnp.take_along_axis(outputs, index[..., None], -1)
        return ((outputs > score).sum(-1) < self.k).astype(jnp.float32)


class TopKCategoricalAccuracy(SparseTopKCategoricalAccuracy):
    """Keras' ``TopKCategoricalAccuracy``: the same with one-hot labels."""

    def __init__(self, k: int = 5, name: str = "top_k_categorical_accuracy"):
        super().__init__(k, name)

    def _index(self, outputs: jax.Array, labels: jax.Array) -> jax.Array:
        return labels.argmax(-1)


class Hinge(_Average):
    """Keras' ``Hinge``: ``mean(max(1 - y * output, 0))`` per sample, labels of 0 and 1 taken as
    -1 and 1 when every valid label of the batch is 0 or 1 (Keras' rule). Lower is better."""

    _direction = "down"

    def __init__(self, name: str = "hinge"):
        self.name = name

    def values(
        self, outputs: jax.Array, labels: jax.Array, mask: jax.Array | None, activation: str | None
    ) -> jax.Array:
        true = labels.reshape(outputs.shape).astype(jnp.float32) if labels.size == outputs.size else None
        if true is None:
            raise ValueError(f"metrics: hinge: labels {labels.shape} for outputs {outputs.shape}")
        valid = _row_mask(mask, true) > 0
        binary = jnp.all(~valid | (true == 0) | (true == 1))
        true = jnp.where(binary, 2.0 * true - 1.0, true)
        return jnp.maximum(1.0 - true * outputs.astype(jnp.float32), 0.0)


#: Keras' string names of the metrics above (``metrics=["auc", "f1_score"]``).
KERAS_NAMES: dict[str, type[KerasMetric]] = {
    "auc": AUC,
    "precision": Precision,
    "recall": Recall,
    "f1_score": F1Score,
    "binary_accuracy": BinaryAccuracy,
    "categorical_accuracy": CategoricalAccuracy,
    "sparse_categorical_accuracy": SparseCategoricalAccuracy,
    "hinge": Hinge,
}
