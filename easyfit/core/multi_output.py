"""Models with several outputs: per-output losses, loss weights and metrics, in Keras' way.

When ``y`` is a dict (or a tuple) of arrays, the model returns a dict (or a tuple) of outputs
of the same layout, and, as in Keras' ``compile``:

* ``loss`` is one loss for every output, a dict ``{output: loss}`` (a list for tuples; an output
  left out, or given None, has no loss), or None: each output's loss is inferred from its
  labels as for a single output;
* ``loss_weights`` (a dict or a list) multiplies each output's loss: the total loss of a sample
  is the weighted sum of its outputs' losses;
* ``metrics`` is a dict ``{output: metric or [metrics]}`` (a list with one entry per output for
  tuples); by default, accuracy for each output with a classification loss.

The logs name them as Keras does: ``loss`` (the total), ``<output>_loss`` (each output's own loss,
not weighted by its loss weight, when more than one output has a loss), ``<output>_<metric>``;
tuple outputs are named ``output_0``, ``output_1``, ...

The loss inferred from each output's labels, ``infer_losses``, and the layout helpers
``is_structured`` and ``output_names`` are ``easyfit.core.losses``' (importable here too).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

import jax

from .losses import LossFn, get_loss, infer_losses, is_structured, output_names
from .metrics import default_metrics, for_output, output_loss

__all__ = [
    "OutputLosses",
    "infer_losses",
    "is_structured",
    "loss_function",
    "losses_by_output",
    "output_names",
]


def _per_output(value: Any, y: Any, argument: str) -> dict[Any, Any]:
    """``value`` given per output (a dict for a dict ``y``, a list for a tuple) or one for all,
    as ``{key: value}`` over ``y``'s outputs (None where it names none)."""
    names = output_names(y)
    if isinstance(value, Mapping):
        if not isinstance(y, Mapping):
            raise ValueError(
                f"{argument}: a dict needs y as a dict of outputs; y is a tuple of {len(y)}: "
                f"give a list with one entry per output"
            )
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ValueError(f"{argument}: {unknown[0]!r} is not an output; the outputs are {list(names)}")
        return {k: value.get(k) for k in names}
    if isinstance(value, (list, tuple)):
        if len(value) != len(names):
            raise ValueError(
                f"{argument}: {len(value)} entries for {len(names)} outputs ({list(names.values())})"
            )
        return dict(zip(names, value, strict=True))
    return dict.fromkeys(names, value)


@dataclasses.dataclass(frozen=True)
class OutputLosses:
    """The loss of a model with several outputs: ``(outputs, labels) -> per-sample losses``,
    the sum over outputs of ``weight * loss(output, labels)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from easyfit.core.multi_output import loss_function
        >>> y = {"kind": jnp.array([0, 1]), "size": jnp.array([[1.0], [3.0]])}
        >>> fn = loss_function({"kind": "sparse_categorical_crossentropy", "size": "mse"},
        ...                    {"kind": 1.0, "size": 0.5}, y)
        >>> out = {"kind": jnp.zeros((2, 2)), "size": jnp.array([[1.0], [1.0]])}
        >>> [round(float(v), 4) for v in fn(out, y)]  # ln 2 + 0.5 * (0, 4)
        [0.6931, 2.6931]
    """

    kind: type  # dict or tuple: the layout the model must return
    keys: tuple[Any, ...]  # the outputs with a loss
    names: tuple[str, ...]
    losses: tuple[Any, ...]  # as given (names or callables)
    weights: tuple[float, ...]
    num_outputs: int

    def fns(self) -> list[LossFn]:
        return [get_loss(loss) for loss in self.losses]

    def __call__(self, outputs: Any, labels: Any) -> jax.Array:
        if not isinstance(outputs, (Mapping, tuple, list)) or (
            isinstance(outputs, Mapping) != (self.kind is dict)
        ):
            got = type(outputs).__name__ if is_structured(outputs) else "a single array"
            raise ValueError(
                f"the model returned {got}, but y is a {self.kind.__name__} of outputs "
                f"{list(self.names)}: return the same layout (a {self.kind.__name__})"
            )
        if self.kind is dict:
            missing = [k for k in self.keys if k not in outputs]
            if missing:
                raise ValueError(f"the model's outputs {sorted(outputs)} lack {missing[0]!r}, which y has")
        elif len(outputs) != self.num_outputs:
            raise ValueError(f"the model returned {len(outputs)} outputs, y has {self.num_outputs}")
        total: Any = 0.0
        for key, fn, weight in zip(self.keys, self.fns(), self.weights, strict=True):
            total = total + weight * fn(outputs[key], labels[key])
        return total

    def metric_fields(self, metrics: Any, y: Any) -> dict[str, Any]:
        """The logs' fields besides ``loss``: ``<output>_loss`` (when more than one output has a
        loss), then ``<output>_<metric>`` for ``metrics`` given per output (Keras' form), or by
        default accuracy for each output with a classification loss."""
        names = output_names(y)
        fields: dict[str, Any] = {}
        if len(self.keys) > 1:
            for key, name, fn in zip(self.keys, self.names, self.fns(), strict=True):
                fields[f"{name}_loss"] = output_loss(key, fn)
        if metrics is None:  # accuracy for each output with a classification loss
            by_loss = dict(zip(self.keys, self.losses, strict=True))
            metrics = {k: default_metrics(None, by_loss.get(k)) for k in names}
            metrics = metrics if isinstance(y, Mapping) else list(metrics.values())
        elif not isinstance(metrics, Mapping) and (isinstance(y, Mapping) or len(metrics) != len(names)):
            raise ValueError(
                f"metrics={metrics!r}: the model has several outputs ({list(names.values())}); "
                "give metrics per output: a dict {output: [metrics]} (for a tuple, a list with "
                "one entry per output)"
            )
        by_key = dict(zip(self.keys, self.losses, strict=True))
        for key, given in _per_output(metrics, y, "metrics").items():
            for metric in [] if given is None else given if isinstance(given, (list, tuple)) else [given]:
                name, cls = for_output(key, metric, by_key.get(key), y[key])
                fields[f"{names[key]}_{name}"] = cls
        return fields


def loss_function(loss: Any, loss_weights: Any, y: Any) -> LossFn:
    """The per-sample loss for labels like ``y`` (a first batch's): ``loss`` by name or
    callable, times ``loss_weights`` (a number) for one output; an :class:`OutputLosses` for a
    dict or a tuple of outputs."""
    if not is_structured(y):
        if isinstance(loss, (Mapping, list, tuple)):
            raise ValueError(
                f"loss={loss!r}: a loss per output needs y as a dict (or a tuple) of outputs; y is one array"
            )
        fn = get_loss(loss)
        if loss_weights is None:
            return fn
        if not isinstance(loss_weights, numbers.Real):
            raise ValueError(f"loss_weights={loss_weights!r}: one output takes one number")
        weight = float(loss_weights)
        return lambda outputs, labels: weight * fn(outputs, labels)
    losses = _per_output(loss, y, "loss")
    weights = _per_output(1.0 if loss_weights is None else loss_weights, y, "loss_weights")
    for key, w in weights.items():
        if w is not None and (not isinstance(w, numbers.Real) or w < 0):
            raise ValueError(f"loss_weights: {w!r} for output {key!r}; expected a number >= 0")
    keys = tuple(k for k, v in losses.items() if v is not None)
    if not keys:
        raise ValueError(f"loss={loss!r}: no output has a loss")
    names = output_names(y)
    for key in keys:
        get_loss(losses[key])  # an unknown name fails here, naming itself
    return OutputLosses(
        kind=dict if isinstance(y, Mapping) else tuple,
        keys=keys,
        names=tuple(names[k] for k in keys),
        losses=tuple(losses[k] for k in keys),
        weights=tuple(1.0 if weights[k] is None else float(weights[k]) for k in keys),
        num_outputs=len(names),
    )


def losses_by_output(loss: Any, y: Any) -> dict[Any, Any]:
    """``{output key: its loss or None}`` for labels ``y`` of several outputs (what each
    output's labels are checked against)."""
    return _per_output(loss, y, "loss")
