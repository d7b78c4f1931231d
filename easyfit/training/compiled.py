"""A trainer's compiled steps: one set per configuration, made when first needed, kept until
``Trainer.close``.

A configuration is what the traced code depends on: the data's input scale, the optimizer steps
per dispatch, the class weights, and the loss and metrics resolved for the labels' layout
(:class:`Resolved`). :class:`CompiledSteps` builds each configuration's jitted functions from
the pure steps of ``easyfit.core.steps`` and the trainer's hooks (``train_step``,
``compute_loss``), which it is given as arguments.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import jax

from ..core import steps
from ..core.metrics import build_collection, default_metrics
from ..core.multi_output import OutputLosses, loss_function

if TYPE_CHECKING:
    from clu import metrics as clu_metrics

    from ..core.losses import LossFn
    from ..core.models import ModelAdapter
    from ..core.precision import Precision
    from ..core.sharding import StateLayout
    from ..parallel import Placement

__all__ = ["CompiledSteps", "HookValues", "Resolved"]


@dataclasses.dataclass(frozen=True)
class HookValues:
    """What the trainer's hooks read besides the state and the batch, one value set once per
    fit (and by an evaluate or predict that makes the state, or a load): the training data's
    input scale (what ``forward`` multiplies ``x`` by) and fit's class weights."""

    #: Given to :meth:`replace` for a value that stays as it is.
    KEEP: ClassVar[object] = object()

    input_scale: float | None = None
    class_weight: tuple[float, ...] | None = None

    def replace(self, input_scale: float | None, class_weight: Any = KEEP) -> HookValues:
        """These values with ``input_scale``, and ``class_weight`` unless it is :attr:`KEEP`."""
        kept = self.class_weight if class_weight is HookValues.KEEP else class_weight
        return HookValues(input_scale, kept)


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The loss and the metrics of one layout of labels: ``loss_fn(outputs, y) -> per-sample
    losses`` (for several outputs the weighted sum of theirs) and the clu Collection class that
    ``compute_metrics`` fills (``loss`` and the metrics asked for)."""

    loss_fn: LossFn
    metrics: type[clu_metrics.Collection]


class CompiledSteps:
    """The jitted steps of one trainer, per configuration (see the module's docstring).

    Args:
        placement: the devices the steps run on.
        layout: where the training state's arrays live (``easyfit.core.sharding``; None:
            replicated).
    """

    def __init__(self, placement: Placement, layout: StateLayout | None = None):
        self._placement = placement
        self._layout = layout
        self._lock = threading.Lock()  # the compiling thread and fit's may resolve at once
        self._resolved: dict[Any, Resolved] = {}
        self._training: dict[tuple[Any, ...], steps.Compiled] = {}
        self._predict: dict[tuple[Any, ...], Callable[..., Any]] = {}

    def resolved(self, loss: Any, loss_weights: Any, metrics: Any, y: Any) -> Resolved:
        """The loss function and the metric collection for labels laid out as ``y`` (arrays or
        tracers), from the trainer's ``loss`` (not None), ``loss_weights`` and ``metrics``; the
        same objects for every batch of that layout."""
        key = jax.tree_util.tree_structure(y)
        with self._lock:
            if key not in self._resolved:
                loss_fn = loss_function(loss, loss_weights, y)
                if isinstance(loss_fn, OutputLosses):
                    collection = build_collection(loss_fn.metric_fields(metrics, y))
                else:
                    collection = build_collection(default_metrics(metrics, loss), loss, y)
                self._resolved[key] = Resolved(loss_fn, collection)
            return self._resolved[key]

    def training(
        self,
        *,
        train_step: Callable[[Any, Any], Any],
        compute_loss: steps.BatchLoss,
        adapter: ModelAdapter,
        precision: Precision,
        metrics: type[clu_metrics.Collection],
        scale: float | None,
        steps_per_execution: int,
        class_weight: tuple[float, ...] | None,
    ) -> steps.Compiled:
        """The training and evaluation functions of a configuration: ``train_step`` (the
        trainer's hook) scanned over a chunk's steps, and easyfit's evaluation step with
        ``compute_loss`` and ``scale``. ``train_step`` must train with ``scale`` and
        ``class_weight`` (the key they are kept by)."""
        key = (scale, steps_per_execution, class_weight, metrics)
        with self._lock:
            if key not in self._training:
                k, placement = steps_per_execution, self._placement
                evaluate = steps.make_eval_step(adapter, compute_loss, metrics, scale, precision)
                self._training[key] = steps.Compiled(
                    train=steps.trains(train_step, placement, k, self._layout),
                    eval=steps.compile_eval(evaluate, placement, k),
                    metrics=metrics,
                )
            return self._training[key]

    def predictor(
        self, adapter: ModelAdapter, precision: Precision, scale: float | None, steps_per_execution: int
    ) -> Callable[..., Any]:
        """The jitted prediction function for inputs of ``scale`` (``steps.compile_predict``)."""
        key = (scale, steps_per_execution)
        with self._lock:
            if key not in self._predict:
                self._predict[key] = steps.compile_predict(
                    adapter, scale, self._placement, steps_per_execution, precision
                )
            return self._predict[key]

    def configurations(self) -> list[steps.Compiled]:
        """The training configurations compiled so far, in the order they were made."""
        return list(self._training.values())

    def metric_direction(self, name: str) -> str | None:
        """``"up"`` or ``"down"``, as the metric logged as ``name`` declares it (``_direction``),
        or None when no resolved collection has such a metric with a direction. ``<name>_<i>``,
        one of a metric's several values (one per class), goes the metric's way."""
        stem, _, index = name.rpartition("_")
        for resolved in self._resolved.values():
            fields = {field.name: field.type for field in dataclasses.fields(resolved.metrics)}
            found = fields.get(name, fields.get(stem) if index.isdigit() else None)
            if found is not None:
                return getattr(found, "_direction", None)
        return None

    def clear(self) -> None:
        """Forgets every compiled function and resolved loss (``Trainer.close``)."""
        with self._lock:
            self._resolved.clear()
            self._training.clear()
            self._predict.clear()
