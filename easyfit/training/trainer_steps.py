"""The trainer's steps: what it compiles, and the methods a subclass overrides to change them.

:class:`TrainerSteps` is the part of :class:`easyfit.Trainer` (a base class, below the loops of
``easyfit/training/trainer.py`` and above
:class:`~easyfit.training.trainer_state.TrainerState`) that resolves the loss and the metrics
from the first batch and compiles the jitted steps for each configuration.
As in Keras, a subclass changes training at two levels, both traced into the jitted chunk:

* ``compute_loss(outputs, batch) -> per-sample losses``: the loss alone;
* ``train_step(state, batch) -> (state, metrics)``: the whole step, with ``forward`` (the model)
  and ``compute_metrics`` to build it from.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from . import steps
from .fit_options import check_class_weight
from .metrics import build_collection, default_metrics
from .models import check_input_shape, input_spec
from .multi_output import OutputLosses, infer_losses, is_structured, loss_function, losses_by_output
from .trainer_state import TrainerState

if TYPE_CHECKING:
    import threading

    from ..data.plan import Plan
    from ..data.sources.base import Source
    from .losses import LossFn
    from .state import TrainState

__all__ = ["TrainerSteps"]

log = logging.getLogger("easyfit")


@dataclasses.dataclass(frozen=True)
class _Context:
    """What the overridable methods use while one configuration's steps are traced."""

    default_train_step: Callable[[Any, Any], Any]
    loss_fn: LossFn
    metrics: Any
    scale: float | None


class TrainerSteps(TrainerState):
    """The steps of a :class:`easyfit.Trainer` and their hooks (see there and docs/models.md)."""

    loss: Any
    loss_weights: Any
    metrics: Any
    _loss_note: str | None
    _loss_fn: LossFn
    _class_weight: tuple[float, ...] | None
    _compiled: dict[Any, Any]
    _tracing: threading.local
    gradient_accumulation_steps: int | None

    # -------------------------------------------------------- hooks, traced into the jitted steps
    def compute_loss(self, outputs: Any, batch: Mapping[str, Any]) -> jax.Array:
        """Per-sample losses of a batch (``x``, ``y``, ``mask`` and, when given,
        ``sample_weight``) in the jitted steps: override it to change the loss alone (easyfit
        applies the sample and class weights, masks and averages). For a model with several
        outputs, the weighted sum of the outputs' losses."""
        context = getattr(self._tracing, "context", None)
        return (context.loss_fn if context is not None else self._loss_fn)(outputs, batch["y"])

    def train_step(self, state: TrainState, batch: Mapping[str, Any]) -> tuple[TrainState, Any]:
        """One optimizer step, ``(state, batch) -> (state, metrics)``: a pure function, traced
        once into the jitted chunk (a ``lax.scan`` over ``steps_per_execution`` steps).

        Override it to take full control of training, as Keras' ``train_step``; call
        ``super().train_step(state, batch)`` for easyfit's step. The contract:

        * ``state``: the :class:`~easyfit.training.state.TrainState` (``step``, ``params``,
          ``opt_state``, ``model_state``, ``rng``, ``dynamic_scale``), replicated.
        * ``batch``: ``x`` and ``y`` as the source delivers them (arrays, or dicts or tuples of
          arrays), ``mask`` (False for padding rows, which must count zero) and, when given,
          ``sample_weight``; sharded on the rows over the devices.
        * returns the new state (``step`` counted up by one) and the batch's metrics, built by
          :meth:`compute_metrics` (the logs' fields: ``loss`` and the metrics asked for).

        :meth:`forward` runs the model, :meth:`compute_loss` gives per-sample losses,
        ``self.optimizer`` is the optax transformation. A step whose rows would all be padding (the
        end of an epoch in a chunk of several steps) is not run.
        """
        return self._context().default_train_step(state, batch)

    def forward(
        self, params: Any, model_state: Any, x: Any, *, train: bool, rng: jax.Array | None = None
    ) -> tuple[Any, Any]:
        """``(outputs, model_state)``: the model on a batch's ``x`` as the source delivers it
        (scaled, in the precision's compute dtype; float32 outputs), in training mode (dropout
        with ``rng``, batch statistics updated) or not. For :meth:`train_step`."""
        scale = self._context().scale
        return steps.forward(self._adapter, self.precision, scale, params, model_state, x, train, rng)

    def compute_metrics(self, outputs: Any, batch: Mapping[str, Any], loss: jax.Array) -> Any:
        """The metrics of one batch (a clu Collection: the trainer's ``loss`` and metrics)
        from the model's ``outputs``, the batch and the per-sample ``loss`` (weighted as the
        loss that was minimised). For :meth:`train_step`."""
        return steps.batch_metrics(self._context().metrics, outputs, dict(batch), loss)

    def metric_direction(self, name: str) -> str | None:
        """Whether a higher (``"up"``) or a lower (``"down"``) value of the metric logged as
        ``name`` is better, as the metric declares it (Keras' ``_direction``: easyfit's named
        metrics declare it, a custom metric may); None when no metric of the compiled steps
        has that name and a direction. What ``mode="auto"`` of the callbacks with a
        ``monitor`` goes by."""
        for compiled in self._compiled.values():
            if isinstance(compiled, steps.Compiled):
                for field in dataclasses.fields(compiled.metrics):
                    if field.name == name:
                        return getattr(field.type, "_direction", None)
        return None

    def _context(self) -> _Context:
        context = getattr(self._tracing, "context", None)
        if context is None:
            raise RuntimeError(
                "train_step, forward and compute_metrics run inside the steps easyfit compiles "
                "(fit, evaluate); they are not called directly"
            )
        return context

    def _within(self, context: _Context, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with ``context`` set while it is traced (per thread)."""

        def traced(*args: Any) -> Any:
            previous = getattr(self._tracing, "context", None)
            self._tracing.context = context
            try:
                return fn(*args)
            finally:
                self._tracing.context = previous

        return traced

    # -------------------------------------------------------------------------- compilation
    def _resolved_loss(self, source: Source, chunk: Mapping[str, Any]) -> LossFn:
        if self.loss is None:
            labels = self._data.labels(source, chunk)
            self.loss, why = infer_losses(None, chunk["y"], labels, source.label_dtype, source.default_loss)
            self._loss_note = f"loss={self.loss!r} (none given; {why})"
            log.info("easyfit: %s", self._loss_note)
        return loss_function(self.loss, self.loss_weights, chunk["y"])

    def _functions(self, source: Source, plan: Plan, chunk: Mapping[str, Any]) -> steps.Compiled:
        key = (source.scale, plan.steps_per_execution, self._class_weight)
        if key not in self._compiled:
            loss_fn = self._loss_fn = self._resolved_loss(source, chunk)
            if self._class_weight is not None and is_structured(chunk["y"]):
                raise ValueError(
                    "class_weight: the model has several outputs (y is a dict or a tuple); weight "
                    "the samples with sample_weight= instead"
                )
            weights = None if self._class_weight is None else jnp.asarray(self._class_weight)
            if isinstance(loss_fn, OutputLosses):
                collection = build_collection(loss_fn.metric_fields(self.metrics, chunk["y"]))
            else:
                collection = build_collection(default_metrics(self.metrics, self.loss))
            adapter, precision, scale, k = (
                self._adapter,
                self.precision,
                source.scale,
                plan.steps_per_execution,
            )
            default = steps.make_train_step(
                adapter, self.optimizer, self.compute_loss, collection, scale, precision, weights
            )
            context = _Context(default, loss_fn, collection, scale)
            evaluate = steps.make_eval_step(adapter, self.compute_loss, collection, scale, precision)
            train = self._within(context, self.train_step)
            if self.ema_momentum is not None:
                train = steps.with_ema(train, self.ema_momentum, self.gradient_accumulation_steps)
            self._compiled[key] = steps.Compiled(
                train=steps.trains(train, self.placement, k),
                eval=steps.compile_eval(self._within(context, evaluate), self.placement, k),
                metrics=collection,
            )
        return self._compiled[key]

    def _check_class_weight(self, class_weight: Mapping[Any, float] | None, chunk: Mapping[str, Any]) -> None:
        """ValueError for a ``class_weight`` key past the model's classes (its outputs, or 0
        and 1 for a single output), once the state exists."""
        if not class_weight or is_structured(chunk["y"]):
            return
        state = self._require_state()
        size = self._adapter.num_outputs(state.params, state.model_state, input_spec(chunk["x"])[0])
        check_class_weight(class_weight, 2 if size == 1 else int(size))

    def _predictor(self, source: Source, plan: Plan) -> Callable[..., Any]:
        """The jitted prediction function for ``source`` (``steps.compile_predict``)."""
        key = ("predict", source.scale, plan.steps_per_execution)
        if key not in self._compiled:
            self._compiled[key] = steps.compile_predict(
                self._adapter, source.scale, self.placement, plan.steps_per_execution, self.precision
            )
        return self._compiled[key]

    def _abstract_state(self, chunk: Mapping[str, Any]) -> Any:
        """Shapes, dtypes and shardings of the state, before it exists (no computation)."""
        if self.state is None:
            return self._init_state(*input_spec(chunk["x"]), True)
        return self.placement.abstract(self.state)

    def _empty(self, fns: steps.Compiled) -> Any:  # placed as the steps return them (one compile)
        return self.placement.replicate(fns.metrics.empty())

    def _ensure_state(self, chunk: Mapping[str, Any], source: Source, labels: bool = True) -> None:
        """Creates the state from a first batch if there is none; with ``labels``, resolves the
        loss and checks the source's labels (once per source)."""
        if self.state is None:
            self._init_state(*input_spec(chunk["x"]))
            if self.class_names is None:
                self.class_names = source.class_names
            self._input_scale = source.scale
            self._data.adopt(source)
        elif self._input_spec is not None and self._input_spec[1] is not None:  # a shape known
            built, model = self._input_spec[0], self.state
            check_input_shape(
                built,
                input_spec(chunk["x"])[0],
                lambda shape: self._adapter.num_outputs(model.params, model.model_state, shape),
                source.describe(),
            )
        if not labels:
            return
        self._resolved_loss(source, chunk)  # sets self.loss when it was None
        state = self._require_state()
        y = chunk["y"]
        self._data.check_labels(
            source,
            losses_by_output(self.loss, y) if is_structured(y) else self.loss,
            lambda: self._adapter.output_shapes(state.params, state.model_state, input_spec(chunk["x"])[0]),
            chunk,
            inferred=self._loss_note,
        )
