"""Trainer: one class that holds its configuration and its training state, coordinates fit,
evaluate and predict, and defines the hooks a subclass overrides.

The work is elsewhere: the data inputs (``easyfit.data.DataInputs``) resolve what to read and
lend streams of global batches; the compiled steps (``easyfit.training.compiled.CompiledSteps``, from
the pure steps of ``easyfit.core.steps``) train and evaluate; ``easyfit.training.checks``
infers the loss and checks the labels; ``easyfit.training.model_io`` saves, loads, exports
and summarises the trained model through persistence (``easyfit.persistence``, which works on
plain values); callbacks report (see docs/architecture.md).

The hooks (``compute_loss``, ``train_step``, ``forward``, ``compute_metrics``) take the state
and the batch as arguments and the rest of their configuration from the trainer's attributes,
set before any step is compiled, as Keras' ``train_step(state, data)`` does: the optimizer, the
precision, the loss (given, or inferred from the first labels), the training data's input scale
and fit's class weights. So they trace into the compiled steps and run as well outside them.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import distributed
from .._env import arrange_determinism
from .._interrupts import shielded
from .._lazy import import_while
from ..callbacks import Callback, CallbackList, History
from ..callbacks.callback_list import LazyLogs, as_list, fit_callbacks, fit_completed, resume_point
from ..callbacks.progbar import format_value
from ..core import steps
from ..core.losses import LossFn, is_structured
from ..core.metrics import compute_on_host
from ..core.models import adapt, input_spec, write_back
from ..core.optimizers import accumulating, get_optimizer
from ..core.precision import get_precision
from ..core.sharding import StateLayout, StateSharding
from ..core.state import StateMaker, TrainState, inference_params
from ..data.inputs import DataInputs, TrainingData
from ..errors import Preempted
from ..parallel import Placement, gather_to_host
from ..persistence import checkpoint, metadata
from . import checks, model_io
from .args import check_int, check_momentum
from .compiled import CompiledSteps, HookValues, Resolved
from .fit_loop import EpochLoop, FirstStep
from .fit_options import FitArgs, check_class_weight
from .interrupt import deferred_signals

if TYPE_CHECKING:
    from ..data.plan import Plan
    from ..data.sources.base import Source
    from ..persistence.checkpoint import ResumePoint

__all__ = ["Trainer"]


class Trainer:
    """Trains a Flax model on data read by DALI, Keras style.

    Args:
        model: a ``flax.linen.Module`` (initialised from the first batch's shape) or a
            ``flax.nnx.Module`` (already initialised). A linen module whose ``__call__`` takes
            ``train``, ``training`` or ``deterministic`` gets it set for training and evaluation.
        optimizer: an optax GradientTransformation (default ``optax.adam(1e-3)``), or a Keras
            name with Keras' defaults: ``"adam"``, ``"sgd"``, ``"rmsprop"``, ``"adamw"``,
            ``"adagrad"`` (see [Optimizers](models.md#optimizers)).
        loss: a Keras loss name (``"sparse_categorical_crossentropy"``,
            ``"categorical_crossentropy"``, ``"binary_crossentropy"``, ``"mse"``, ``"mae"``), a
            function ``(y_true, y_pred) -> per-sample losses`` (Keras' order), or an optax loss
            (called in optax's order; see [Losses and metrics](models.md#losses-and-metrics)).
            Models output logits. None:
            sparse categorical cross-entropy for integer labels (shape ``(n,)`` or ``(n, 1)``),
            categorical cross-entropy for one-hot float labels, mse for other float labels
            (``fit`` says which at ``verbose >= 1``). For a model with several outputs (``y`` a
            dict or a tuple), one loss for all or a dict ``{output: loss}`` (a list for a
            tuple), as in Keras ([Several inputs and outputs](models.md#several-inputs-and-outputs)).
        metrics: Keras metric names (``"accuracy"``, ``"auc"``, ``"f1_score"``, ...), Keras'
            metric objects (``ef.metrics.AUC()``, ``ef.metrics.MeanIoU(num_classes=3)``, ...),
            functions ``(y_true, y_pred) -> per-sample values`` (called as ``loss`` functions
            are) or clu metrics (see [Losses and metrics](models.md#losses-and-metrics)).
            None: ``["accuracy"]`` for classification losses, none otherwise. For several
            outputs, a dict ``{output: [metrics]}`` (a list of entries for a tuple).
        loss_weights: for several outputs, a dict ``{output: weight}`` (a list for a tuple)
            multiplying each output's loss in the total, as Keras' ``loss_weights``.
        seed: seeds initialisation, shuffling and dropout: the same seed gives the same
            parameters.
        steps_per_execution: optimizer steps per dispatch (one jitted ``lax.scan``); batch
            callbacks then fire once per dispatch, their ``batch`` counting dispatches where
            Keras counts steps ([Coming from Keras](keras.md#callbacks)). ``"auto"`` (default):
            on GPUs enough steps per dispatch to keep the devices busy, more when training from
            the device cache, never more than an epoch; on CPUs one step, since XLA's CPU
            convolutions run slower inside a scan ([Performance](performance.md)).
        devices: the devices to train on (default: all of ``jax.devices()``).
        num_threads: DALI threads per pipeline (default: chosen from the cores; see
            [Am I input-bound?](performance.md#am-i-input-bound)).
        pipelines_per_device: DALI pipelines per GPU (default: chosen from the cores).
        precision: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` (with dynamic loss
            scaling): the dtype of the forward and backward passes; parameters, optimizer state,
            BatchNorm statistics, loss and metrics stay float32 (see
            [Mixed precision](models.md#mixed-precision)).
        deterministic: True asks XLA for runs that repeat bit for bit on a GPU: adds
            ``--xla_gpu_deterministic_ops=true`` to ``XLA_FLAGS`` (deterministic kernels, no
            autotuning by timing), which takes effect only if JAX's backend has not started yet;
            otherwise it warns. DALI's random draws are seeded already. Costs speed on a GPU
            ([Do runs repeat?](performance.md#do-runs-repeat)); changes nothing on a CPU, where
            runs repeat bit for bit anyway.
        gradient_accumulation_steps: None (default), or k >= 2: the optimizer updates once
            every k batches, with the mean of their gradients (``optax.MultiSteps``), as
            Keras' optimizer argument. Batches, not updates, are what ``steps_per_epoch``,
            progress, callbacks and ``state.step`` count; BatchNorm statistics move every
            batch ([Gradient accumulation](models.md#gradient-accumulation)).
        ema_momentum: None (default), or m in [0, 1]: keep an exponential moving average of
            the parameters, updated on the device after every batch (Keras' ``use_ema=True,
            ema_momentum=m``); evaluation (validation in fit too), prediction, export and
            ``trainer.params`` use it, ``trainer.state.params`` stays the raw weights
            ([EMA](models.md#a-moving-average-of-the-weights-ema)).
        sharding: where the training state lives on the devices: ``"replicated"`` (default,
            whole on each), ``"zero1"`` (optimizer state and moving average split over the
            devices), ``"fsdp"`` (the parameters and BatchNorm statistics too; arrays over 4 MiB,
            along their largest dimension the device count divides), or a list of
            ``(regex, PartitionSpec)`` rules over parameter paths such as ``"Dense_0/kernel"``
            ([Sharding the state](multi-device.md#sharding-the-state)).
        mesh: the mesh's axes and their sizes, in order (one may be -1: the devices left);
            default ``{"data": -1}``. Batches are split over ``"data"`` only; another axis
            (``{"data": -1, "model": 2}``) is for rules that name it: tensor parallel
            ([A second mesh axis](multi-device.md#a-second-mesh-axis-tensor-parallel)).

    Example:
        >>> import optax, tempfile, easyfit as ef
        >>> tmp = tempfile.mkdtemp()
        >>> from flax import linen as nn
        >>> class MLP(nn.Module):
        ...     @nn.compact
        ...     def __call__(self, x):
        ...         return nn.Dense(10)(nn.relu(nn.Dense(64)(x.reshape((x.shape[0], -1)))))
        >>> root = ef.datasets.sample_folder(tmp + "/mnist", limit=(200, 50))
        >>> with ef.Trainer(MLP(), optimizer=optax.adam(1e-3), seed=0) as trainer:
        ...     history = trainer.fit(root, epochs=2, batch_size=50, verbose=0)
        ...     outputs = trainer.predict(root + "/val")
        >>> sorted(history.history), outputs.shape
        (['accuracy', 'input_wait', 'loss', 'val_accuracy', 'val_loss'], (50, 10))
    """

    def __init__(
        self,
        model: Any,
        optimizer: optax.GradientTransformation | str | None = None,
        loss: str | LossFn | None = None,
        metrics: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        loss_weights: Mapping[str, float] | Sequence[float] | float | None = None,
        seed: int = 0,
        steps_per_execution: int | str = "auto",
        devices: Sequence[jax.Device] | None = None,
        num_threads: int | None = None,
        pipelines_per_device: int | None = None,
        precision: str = "float32",
        deterministic: bool = False,
        gradient_accumulation_steps: int | None = None,
        ema_momentum: float | None = None,
        sharding: str | Sequence[tuple[str, Any]] | StateSharding = "replicated",
        mesh: Mapping[str, int] | None = None,
    ):
        if not isinstance(deterministic, bool):
            raise TypeError(f"deterministic={deterministic!r}: must be True or False")
        self.deterministic = deterministic
        if deterministic:  # first: the flag must be in XLA_FLAGS before the backend starts
            arrange_determinism()
        # the arguments: checked and kept here, before anything is built from them
        if steps_per_execution != "auto":
            check_int("steps_per_execution", steps_per_execution, 1)
        self._adapter, self._nnx_variables = adapt(model)
        self._model = model
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.optimizer: optax.GradientTransformation = accumulating(
            get_optimizer(optimizer), gradient_accumulation_steps
        )
        self._optimizer_name = optimizer if isinstance(optimizer, str) else None  # its Keras name
        self.ema_momentum = check_momentum(ema_momentum)
        self.sharding = StateSharding.of(sharding)
        self._optimizer_given = optimizer is not None
        self.loss: Any = loss  # set from the first labels when None
        self.loss_weights = loss_weights
        self.metrics = metrics
        self.seed = int(seed)
        self.precision = get_precision(precision)
        self.steps_per_execution = steps_per_execution
        # DALI's import, which fit's first pipeline needs, while JAX's runtime starts
        self.placement = import_while(
            lambda: Placement.create(devices, mesh), "nvidia.dali.fn", "nvidia.dali.pipeline"
        )
        loader_options = {"num_threads": num_threads, "pipelines_per_device": pipelines_per_device}

        # what the trainer builds and keeps
        self._data = DataInputs(self.placement, self.seed, steps_per_execution, loader_options)
        self._layout = StateLayout(self.sharding, self.placement.mesh)  # where the state lives
        self._steps = CompiledSteps(self.placement, self._layout)
        self.state: TrainState | None = None
        self.history: History | None = None
        self.class_names: list[str] | None = None
        self.batch_size = 32
        self.stop_training = False
        self.stop_evaluating = False
        self.stop_predicting = False
        self._labels = checks.LabelChecks()  # the loss inferred, each source's labels checked
        self._input_spec: tuple[Any, Any] | None = None  # one sample's (see models.input_spec)
        self._maker: StateMaker | None = None  # makes fresh states (_init_state)
        self._hook_values = HookValues()  # what the hooks read: the input scale, class weights
        self._inference_only: str | None = None  # why fit cannot go on (loaded without optimizer)
        self._progress: checkpoint.Progress | None = None
        self._data_fingerprint: dict[str, Any] | None = None  # the last fit's, with a backup

    # ----------------------------------------------------------------------------- public state
    @property
    def params(self) -> Any:
        """The trained parameters (a pytree of jax.Arrays; an ``nnx.State`` for NNX models):
        with ``ema_momentum``, their moving average, which evaluation, prediction and export
        use (the raw weights: ``state.params``)."""
        return inference_params(self._require_state())

    @property
    def model(self) -> Any:
        """The model. For NNX, the module with the trained state merged back in."""
        if self._adapter.kind == "nnx" and self.state is not None:
            variables = (inference_params(self.state), self.state.model_state)
            from flax import nnx

            return nnx.merge(self._adapter.module, *jax.device_get(variables))
        return self._model

    @property
    def progress(self) -> checkpoint.Progress | None:
        """Where the current (or last) fit stands: epoch, batch, loader position."""
        return self._progress

    @property
    def checkpoint_meta(self) -> dict[str, Any]:
        """What a checkpoint records beside the state and the progress: the seed, the input
        shape and dtype, the class names, the optimizer, the training data's input recipe
        (``easyfit.data.recipe``) and its fingerprint (a fit with a backup); see
        ``easyfit.persistence.metadata``."""
        return metadata.checkpoint_meta(
            seed=self.seed,
            input_spec=self._input_spec,
            input_scale=self._hook_values.input_scale,
            class_names=self.class_names,
            precision=self.precision.name,
            data=self._data_fingerprint,
            optimizer=self._optimizer_meta(self.state.opt_state if self.state is not None else None),
            recipe=self._data.recipe,
        )

    # -------------------------------------------------------------------- the overridable hooks
    def compute_loss(self, outputs: Any, batch: Mapping[str, Any]) -> jax.Array:
        """Per-sample losses of a batch (``x``, ``y``, ``mask`` and, when given,
        ``sample_weight``): the trainer's loss of the model's ``outputs`` and ``batch["y"]``;
        for a model with several outputs, the weighted sum of the outputs' losses. Override it
        to change the loss alone: easyfit applies the sample and class weights, masks and
        averages. Traced into the compiled steps; callable outside them once the loss is known
        (given, or inferred by a first fit or evaluate)."""
        return self._resolved(batch["y"]).loss_fn(outputs, batch["y"])

    def train_step(self, state: TrainState, batch: Mapping[str, Any]) -> tuple[TrainState, Any]:
        """One optimizer step, ``(state, batch) -> (state, metrics)``: a pure function, traced
        once into the jitted chunk (a ``lax.scan`` over ``steps_per_execution`` steps).

        Override it to take full control of training, as Keras' ``train_step``; call
        ``super().train_step(state, batch)`` for easyfit's step. The contract:

        * ``state``: the :class:`~easyfit.core.state.TrainState` (``step``, ``params``,
          ``opt_state``, ``model_state``, ``rng``, ``dynamic_scale``, ``ema_params``),
          replicated. With ``ema_momentum``, easyfit updates ``ema_params`` after it.
        * ``batch``: ``x`` and ``y`` as the source delivers them (arrays, or dicts or tuples of
          arrays), ``mask`` (False for padding rows, which must count zero) and, when given,
          ``sample_weight``; sharded on the rows over the devices.
        * returns the new state (``step`` counted up by one) and the batch's metrics, built by
          :meth:`compute_metrics` (the logs' fields: ``loss`` and the metrics asked for).

        :meth:`forward` runs the model, :meth:`compute_loss` gives per-sample losses,
        ``self.optimizer`` is the optax transformation. easyfit's step weights the losses by
        ``sample_weight`` and fit's ``class_weight``, and scales the float16 loss. Steps of an
        epoch's last chunk past its end are not run.
        """
        default = steps.make_train_step(
            self._adapter,
            self.optimizer,
            self.compute_loss,
            self._resolved(batch["y"]).metrics,
            self._hook_values.input_scale,
            self.precision,
            None if self._hook_values.class_weight is None else jnp.asarray(self._hook_values.class_weight),
        )
        return default(state, dict(batch))

    def forward(
        self, params: Any, model_state: Any, x: Any, *, train: bool, rng: jax.Array | None = None
    ) -> tuple[Any, Any]:
        """``(outputs, model_state)``: the model on a batch's ``x`` as the source delivers it
        (times the training data's input scale, in the precision's compute dtype; float32
        outputs), in training mode (dropout with ``rng``, batch statistics updated) or not.
        For :meth:`train_step`; callable outside it too."""
        scale = self._hook_values.input_scale
        return steps.forward(self._adapter, self.precision, scale, params, model_state, x, train, rng)

    def compute_metrics(self, outputs: Any, batch: Mapping[str, Any], loss: jax.Array) -> Any:
        """The metrics of one batch (a clu Collection: the trainer's ``loss`` and metrics)
        from the model's ``outputs``, the batch and the per-sample ``loss`` (weighted as the
        loss that was minimised). For :meth:`train_step`; callable outside it too."""
        return steps.batch_metrics(self._resolved(batch["y"]).metrics, outputs, dict(batch), loss)

    def metric_direction(self, name: str) -> str | None:
        """Whether a higher (``"up"``) or a lower (``"down"``) value of the metric logged as
        ``name`` is better, as the metric declares it (Keras' ``_direction``: easyfit's named
        metrics declare it, a custom metric may); None when no metric of the compiled steps
        has that name and a direction. What ``mode="auto"`` of the callbacks with a
        ``monitor`` goes by."""
        return self._steps.metric_direction(name)

    # ----------------------------------------------------------------------------- closing
    def close(self) -> None:
        """Releases the DALI pipelines, device caches, open files and compiled steps kept between
        passes. The trained state stays; used again, the trainer rebuilds what it needs."""
        self._data.close()
        self._steps.clear()

    def __enter__(self) -> Trainer:
        return self

    if not TYPE_CHECKING:  # (hidden from mypy, which would take every attribute as existing)

        def __getattr__(self, name: str) -> Any:
            if name == "compile":  # the Keras habit: model.compile(optimizer, loss, metrics)
                raise AttributeError(
                    "Trainer has no compile(): its constructor takes compile's arguments, "
                    "ef.Trainer(model, optimizer=..., loss=..., metrics=...)",
                    name=name,
                    obj=self,
                )
            message = f"{type(self).__name__!r} object has no attribute {name!r}"
            raise AttributeError(message, name=name, obj=self)

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ fit
    def fit(
        self,
        x: Any = None,
        y: Any = None,
        *,
        batch_size: int | None = None,
        epochs: int = 1,
        validation_data: Any = None,
        validation_split: float = 0.0,
        callbacks: Iterable[Callback] | Callback | None = None,
        verbose: int = 1,
        shuffle: bool | str = True,
        initial_epoch: int = 0,
        cache: bool | str = "auto",
        class_weight: Mapping[Any, float] | None = None,
        validation_freq: int | Sequence[int] = 1,
        steps_per_epoch: int | None = None,
        sample_weight: Any = None,
        validation_steps: int | None = None,
    ) -> History:
        """Trains for ``epochs`` epochs.

        Args:
            x: a folder (``root/train`` + ``root/val`` layout, or ``root/<class>/*`` alone), an
                ``easyfit.data`` source, or an array of inputs (or a dict or tuple of arrays,
                for several inputs: the model receives the same dict or tuple).
            y: labels, when ``x`` is an array: an array, or a dict or tuple of arrays for
                several outputs.
            batch_size: global batch size, split over all devices (default 32); must divide by
                the number of devices.
            epochs: index of the last epoch (as in Keras, with ``initial_epoch``).
            validation_data: a folder, a source, ``(x_val, y_val)`` or ``(x_val, y_val,
                sample_weight_val)``; overrides the folder found beside ``train/`` and
                ``validation_split``.
            validation_split: hold this fraction of the training data out for validation
                (seeded by ``seed``: the same samples on every run and device count; as many
                as Keras holds out). A folder that has its own ``val/`` beside ``train/`` is
                refused with it (a ValueError says which to drop).
            callbacks: ``easyfit.callbacks.Callback`` instances (any iterable, read once, or
                one Callback), called in this order, then a History (unless one is given: fit
                returns it) and the progress bar.
            verbose: 0 silent, 1 progress bar (a line per epoch when stdout is not a terminal),
                2 a line per epoch.
            shuffle: True: a fresh permutation of the whole dataset every epoch; False: the
                data's own order; ``"batch"``: as Keras, the batches of the data's own order,
                each batch's samples permuted afresh every epoch.
            initial_epoch: the epoch to start from (resuming).
            cache: ``"auto"`` keeps the decoded dataset in device memory when it fits and no
                random augmentation is asked for (recorded while the first epoch streams; a
                source read by a DALI reader, such as an LMDB, is read once before it: see
                ``easyfit.data.cache``), and says what it
                chose in the log; True insists, False always streams.
            class_weight: ``{class index: weight}`` multiplying each training sample's loss,
                as in Keras: a class with no key weighs 1.0, ``{}`` weighs nothing; the class
                of a sample is its label, the argmax of a one-hot row, or a binary label
                rounded. Keys may be ints, numeric strings or integral floats (``"3"``, ``3.0``,
                as JSON gives them); a key that names no class of the model's outputs is a
                ValueError.
            validation_freq: validate every that many epochs, or at the (1-based) epochs
                listed; History holds ``val_*`` for those epochs only.
            steps_per_epoch: an epoch of that many optimizer steps (default: one pass over the
                data). The batches are those of fit without it: epoch 2 goes on where epoch 1
                stopped, into the next pass and its fresh permutation, as Keras with a
                repeating dataset; only where epochs end (logs, validation, callbacks) moves.
                With ``steps_per_execution=k`` an epoch runs ``ceil(steps_per_epoch / k)``
                dispatches (callbacks' ``steps``), the last one's extra steps skipped.
            sample_weight: with arrays, one weight (>= 0) per sample multiplying its loss
                (Keras' reduction: the mean over the rows of ``weight * loss``); it travels with
                its sample through shuffling and sharding, and multiplies ``class_weight``.
            validation_steps: validate on the first that many batches of the validation data,
                the same ones every time, as Keras (default, or more than it has: all of it).

        ``BackupAndRestore`` (a callback's ``restore_point()``) resumes an earlier run, mid-epoch
        too. On Ctrl-C or SIGTERM fit stops after the step in progress, calls ``on_interrupt``
        and ``on_train_end``, then raises KeyboardInterrupt or ``easyfit.errors.Preempted``.

        Returns:
            The History of this fit (the one in ``callbacks`` if given; also
            ``trainer.history``).
        """
        if self._inference_only is not None:  # loaded without its optimizer
            raise ValueError(f"fit: {self._inference_only}")
        args = FitArgs.check(
            batch_size=batch_size,
            epochs=epochs,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch,
            validation_steps=validation_steps,
            validation_split=validation_split,
            validation_freq=validation_freq,
            shuffle=shuffle,
            cache=cache,
            class_weight=class_weight,
            verbose=verbose,
        )
        first_step = FirstStep(warm_up=self.state is None)
        # a model loaded with pretrained weights reads a folder path with their preprocessing
        pre: Any = getattr(self._model, "preprocessing", None)
        settings = pre.image_folder_kwargs() if hasattr(pre, "image_folder_kwargs") else None
        data = self._data.fit_data(
            x, y, validation_data, validation_split, sample_weight, settings, **args.data()
        )
        train, val, windows = data.train, data.validation, data.windows
        _say(*data.left_out)
        self._hook_values = HookValues(data.scale, args.weights)  # what the traced hooks read
        self.class_names = data.class_names
        self.batch_size = batch_size = int(batch_size or self.batch_size)
        callbacks = as_list(callbacks)
        resume = self._resume_point(callbacks, data)
        distributed.agree_on_fit(  # several processes: the same plan in all, or an error, never a hang
            data,
            **args.settings(batch_size),
            resume=None if resume is None else [resume.epoch, resume.batch],
            shuffle_windows=None if windows is None else windows.key(),  # Parquet past its cache
            steps_per_execution=self.steps_per_execution,
            seed=self.seed,
            model=type(self._model).__name__,
            input_spec=self._input_spec,
        )
        stream, why = self._data.train_loader(data, batch_size, resume=resume, **args.stream())
        if args.verbose:
            sharded = (
                f"the training state is sharded: {self._layout.describe()}" if self._layout.sharded else None
            )
            windows = stream.plan.windows  # a shuffle by windows of the source's blocks, said once
            _say(
                why if cache == "auto" else None,
                data.unscaled,
                sharded,
                None if windows is None else windows.note,
            )
        initial_epoch, first_batch = (initial_epoch, 0) if resume is None else (resume.epoch, resume.batch)
        compiled = first_step.start(
            stream,
            stream.plan.live_steps(first_batch),
            peek_spec=self.loss is not None or data.labels_known,
            functions=lambda chunk: self._functions(train, stream.plan, chunk, args.verbose),
            shapes=self._shapes,
            make_state=lambda chunk, labels: self._ensure_state(chunk, train, labels, class_weight),
        )
        empty = functools.partial(self._empty, compiled)
        self.state, metrics = (self.state, None) if resume is None else resume.restore(self.state, empty())
        loop = EpochLoop(first_step, compiled, empty, epoch=initial_epoch, batch=first_batch, metrics=metrics)
        self._progress = loop.progress(initial_epoch, first_batch)
        listed, history = fit_callbacks(callbacks, args.verbose)
        params = {"epochs": epochs, "steps": loop.plan.chunks_per_epoch, "verbose": args.verbose}
        cbs = CallbackList(listed, self, {**params, "batch_size": batch_size})
        self.history, self.stop_training = history, False
        logs: dict[str, float] = {}
        try:
            cbs.call("on_train_begin")  # in the try: on_train_end lets go of what it took
            if resume is not None:
                cbs.restore(resume)  # the callbacks' states the backup holds
            with deferred_signals() as interrupted:
                for epoch in range(initial_epoch, epochs):
                    cbs.begin_epoch(epoch, resumed=loop.mid_epoch)
                    for batch, chunk in loop.batches():
                        cbs.call("on_train_batch_begin", batch)
                        self.state = loop.train(self.state, batch, chunk)
                        self._progress = loop.progress(epoch, batch + 1)
                        if cbs.wants("on_train_batch_end"):
                            cbs.call("on_train_batch_end", batch, logs=loop.running_logs())
                        if self.stop_training or interrupted():
                            break
                    else:
                        self._progress = loop.progress(epoch + 1, 0)
                    if interrupted():
                        raise interrupted.exception()
                    logs = loop.end_epoch(self.state, epoch)  # its metrics and input_wait
                    cbs.validation_skipped = val is not None and not args.validates(epoch)
                    if val is not None and args.validates(epoch):
                        val_logs = self._evaluate(val, batch_size, cbs, validation_steps)
                        logs.update({f"val_{k}": v for k, v in val_logs.items()})
                    cbs.call("on_epoch_end", epoch, logs=logs)
                    if args.verbose:
                        loop.report_input_wait(epoch)  # under the epoch's metrics line
                    if interrupted():
                        raise interrupted.exception()
                    if self.stop_training:
                        break
        except (KeyboardInterrupt, Preempted):
            with shielded("the callbacks' on_interrupt (a backup)"):
                cbs.call("on_interrupt", logs=logs)
            raise
        finally:
            first_step.close()
            try:
                cbs.call_all("on_train_end", logs=logs)  # every callback, even after one raised
            finally:
                write_back(self._model, self.state)  # the user's NNX module holds the trained state
        fit_completed(callbacks)  # only now may a backup go (BackupAndRestore)
        return history

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, model: Any, **kwargs: Any) -> Trainer:
        """A Trainer for ``model`` (built with ``kwargs``) holding the checkpoint at ``path``,
        reading data as the training data was read (the checkpoint's input recipe).

        Without ``optimizer=``, a checkpoint saved with another optimizer than the default
        loads its weights for inference (evaluate, predict, export); ``fit`` then says which
        optimizer to pass. With one that differs from the saved one: CheckpointError naming
        both."""
        return model_io.from_checkpoint(cls, path, model, **kwargs)

    # ------------------------------------------------------------------------------- evaluate
    def evaluate(
        self,
        x: Any,
        y: Any = None,
        *,
        batch_size: int | None = None,
        callbacks: Iterable[Callback] | Callback | None = None,
        verbose: int = 0,
        return_dict: bool = True,
        sample_weight: Any = None,
        steps: int | None = None,
    ) -> dict[str, float] | float | list[float]:
        """Loss and metrics over every sample of ``x`` exactly once.

        Args:
            x: a folder, a source, or arrays (with ``y``; dicts or tuples of arrays too), read
                as the training data was (see ``predict``).
            y: labels, when ``x`` is an array.
            batch_size: global batch size (default: the last fit's).
            callbacks: callbacks whose ``on_test_*`` hooks run.
            verbose: 1 prints the result (and what a folder's listing left out).
            return_dict: True (the default, unlike Keras): a dict by name, as History and the
                callbacks' logs. False: Keras' default form, the loss alone, or
                ``[loss, *metrics]`` when there are metrics.
            sample_weight: with arrays, one weight per sample multiplying its loss.
            steps: evaluate the first that many batches only, as Keras (default, or more
                than there are: every sample once).

        Returns:
            ``{"loss": ..., "accuracy": ..., ...}`` (a float or a list with ``return_dict=False``).
        """
        check_int("batch_size", batch_size, 1, none=True)
        check_int("steps", steps, 1, none=True)
        source = self._data.source(x, y, sample_weight)
        for note in self._data.left_out(source) if verbose and jax.process_index() == 0 else ():
            print(f"easyfit: {note}", flush=True)
        batch_size = int(batch_size or self.batch_size)
        distributed.agree_on_pass("evaluate", source, batch_size=batch_size, steps=steps)
        logs = self._evaluate(source, batch_size, CallbackList(as_list(callbacks), self, {}), steps)
        if verbose and jax.process_index() == 0:
            print(" - ".join(f"{k}: {format_value(v)}" for k, v in logs.items()), flush=True)
        return logs if return_dict else logs["loss"] if len(logs) == 1 else list(logs.values())

    @contextlib.contextmanager
    def _pass(
        self, source: Source, batch_size: int, predict: bool = False, steps: int | None = None
    ) -> Iterator[tuple[Any, Any]]:
        """A leased loader over ``source`` (its first ``steps`` batches) and the compiled steps
        for it (``evaluate``), or with ``predict`` the prediction function (no labels: no loss)."""
        with self._data.lease(source, batch_size, steps) as loader:
            chunk, made = loader.peek(), self.state is None
            compiled: Any = None if predict else self._functions(source, loader.plan, chunk)
            try:
                self._ensure_state(chunk, source, labels_too=not predict)
            finally:
                if made and self.state is not None:  # made from this data (its labels refused too)
                    self._data.adopt(source)  # its input recipe: fit's data had set it already
            if made:  # the state made from this data: its scale (and names, if none yet)
                self._know(
                    source.scale, self.class_names if self.class_names is not None else source.class_names
                )
            if predict:
                k = loader.plan.steps_per_execution
                compiled = self._steps.predictor(self._adapter, self.precision, source.scale, k)
            yield loader, compiled

    def _evaluate(
        self, source: Source, batch_size: int, cbs: CallbackList, steps: int | None = None
    ) -> dict[str, float]:
        with self._pass(source, batch_size, steps=steps) as (loader, compiled):
            self.stop_evaluating = False
            cbs.call("on_test_begin")
            metrics = self._empty(compiled)
            for batch in range(loader.plan.chunks_per_epoch):
                cbs.call("on_test_batch_begin", batch)
                metrics = compiled.eval(self.state, metrics, next(loader))
                if cbs.wants("on_test_batch_end"):
                    running = LazyLogs(functools.partial(compute_on_host, metrics))
                    cbs.call("on_test_batch_end", batch, logs=running)
                if self.stop_evaluating:
                    break
            logs = compute_on_host(metrics)
        cbs.call("on_test_end", logs=logs)
        return logs

    # -------------------------------------------------------------------------------- predict
    def predict(
        self,
        x: Any,
        *,
        batch_size: int | None = None,
        callbacks: Iterable[Callback] | Callback | None = None,
        verbose: int = 0,
        steps: int | None = None,
    ) -> Any:
        """Model outputs for every sample of ``x``, once each, in the source's order.

        ``x`` may be a folder of images, with or without class folders (every image at any
        depth: a folder's images sorted by name, then its sub-folders' by name, as
        ``ImageFolder.files`` orders class folders; ``easyfit.data.ImageFiles(x).files`` names
        them), an image file, a list of image paths, or a dict or a tuple of arrays (several
        inputs). ``verbose``: 1 says what a folder's listing left out. ``steps``: the outputs
        of the first that many batches only, as Keras (default, or more than there are: every
        sample). Paths and arrays are read as the training data was (its input recipe, also
        after a load; no augmentation): after training on images, a uint8 array of images is
        resized, center-cropped, scaled and normalised as the image files were, and a float
        array is taken as already prepared; after training on arrays, their ``scale``
        applies. A source given as ``x`` is read as it is configured.

        Returns:
            A NumPy array with one row per sample; for a model with several outputs, a dict or
            a tuple of them.
        """
        check_int("batch_size", batch_size, 1, none=True)
        check_int("steps", steps, 1, none=True)
        source = self._data.source(x, inputs_only=True)
        for note in self._data.left_out(source) if verbose and jax.process_index() == 0 else ():
            print(f"easyfit: {note}", flush=True)
        batch_size = int(batch_size or self.batch_size)
        distributed.agree_on_pass("predict", source, batch_size=batch_size, steps=steps)
        cbs = CallbackList(as_list(callbacks), self, {})
        outputs = []
        with self._pass(source, batch_size, predict=True, steps=steps) as (loader, infer):
            self.stop_predicting = False
            cbs.call("on_predict_begin")
            for batch in range(loader.plan.chunks_per_epoch):
                cbs.call("on_predict_batch_begin", batch)
                outputs.append(infer(self.state, next(loader)))
                if cbs.wants("on_predict_batch_end"):
                    batch_outputs = LazyLogs(functools.partial(_host_outputs, outputs[-1]))
                    cbs.call("on_predict_batch_end", batch, logs=batch_outputs)
                if self.stop_predicting:
                    break
        result = jax.tree_util.tree_map(lambda *outs: np.concatenate(outs), *[_on_host(o) for o in outputs])
        cbs.call("on_predict_end")
        return result

    # ------------------------------------------------------------- summary, export, checkpoints
    def summary(
        self,
        input_shape: Any = None,
        *,
        input_dtype: Any = None,
        print_fn: Callable[[str], Any] | None = None,
        line_length: int | None = None,
    ) -> None:
        """Prints the model's layers in the order it calls them, with their output shapes and
        parameters, then the totals: trainable, non-trainable (BatchNorm statistics, NNX random
        keys) and bytes. Returns None, as Keras' ``Model.summary``.

        Before ``fit``, ``input_shape`` builds the model for the table (as Keras' ``build``;
        the trainer's parameters are not made: ``fit`` makes them from its data). After
        ``fit``, the trained model for the training data's shape.

        Args:
            input_shape: one sample's shape, without the batch axis: ``(28, 28, 1)``; a dict or
                a tuple of shapes for a model of several inputs. Default: the training data's.
            input_dtype: the inputs' dtype (default float32, as the model receives them in
                training); a dict or a tuple of dtypes for several inputs.
            print_fn: called once with the whole text (None: ``print``); e.g.
                ``lines.append`` to keep it.
            line_length: the table's width in characters, its longer cells wrapped (None: as
                wide as its cells need, nothing wrapped).

        Raises:
            RuntimeError: before ``fit`` without ``input_shape``.
            ValueError: ``input_shape`` or ``input_dtype`` is not a shape or a dtype.
        """
        model_io.summary(self, input_shape, input_dtype, print_fn, line_length)

    def export(self, path: str | os.PathLike, *, inputs: str = "images") -> str:
        """Writes the inference function with the trained weights as serialized StableHLO and
        ``model.json`` (class names, input recipe): it runs with JAX alone, for any batch size
        ([Summary and export](models.md#summary-and-export)).

        Args:
            path: the directory to write.
            inputs: ``"images"`` (default): for a model trained on images, the function takes
                uint8 NHWC images of the trained size and colour mode and applies the scale and
                the normalisation inside; ``model.json``'s ``recipe`` and ``preprocessing`` say
                what a server must still do (decode, resize, center crop). For other data the
                same as ``"prepared"``. ``"prepared"``: inputs as the train step sees them (as
                the training source delivered them: float16 already normalised, for a source
                with ``normalize=``).

        Returns:
            ``path``.
        """
        return model_io.export(self, path, inputs)

    def save(
        self, path: str | os.PathLike, *, weights_only: bool = False, adapters_only: bool = False
    ) -> str:
        """Writes an Orbax checkpoint: parameters, optimizer state, step, RNG key, the epoch
        reached, the seed, and the training data's input recipe as plain JSON, so that ``load``
        reads data as training did (see [Checkpoints](checkpoints.md#save-and-load)). Replaces a
        checkpoint already at ``path`` only once the new one is complete.

        Args:
            path: the checkpoint's directory.
            weights_only: save the parameters (and model state) only.
            adapters_only: for a model with LoRA adapters (``trainable="lora:rank=N"``), save
                the adapters and the head alone, with their optimizer state, the input recipe and
                the epoch reached,
                as PEFT's ``save_pretrained`` does: ``load`` (or ``ef.models.load_adapters``)
                puts them onto a model built from the same base weights
                ([Fine-tuning](finetune.md#saving-adapters)).

        Returns:
            The absolute path written.
        """
        return model_io.save(self, path, weights_only, adapters_only)

    def load(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restores a checkpoint written by ``save`` (or ``ModelCheckpoint``).

        The trainer must have the same model, and to go on training the same optimizer. A full
        checkpoint also restores the seed, the class names and the epoch: go on with
        ``fit(..., initial_epoch=meta["epoch"])``. The training data's input recipe comes back
        too: paths and arrays are then read as in training (``easyfit.data.recipe``); a
        checkpoint without one (an older easyfit's) warns and leaves the trainer's reading as
        it was. Saved with another optimizer than this trainer's: when none was given to the
        trainer, the parameters, model state and step load for inference (``fit`` then says
        which optimizer to pass); when one was, CheckpointError naming both.

        A folder of LoRA adapters (``save(adapters_only=True)``, ``ModelCheckpoint(...,
        adapters_only=True)``) loads onto the trainer's model, whose base weights stay (from
        ``load_weights`` or the constructor): the adapters and the head, the class names, the
        input recipe, and the optimizer state and step when the trainer's optimizer has the
        saved one's layout (else a warning, and the trainer's own); go on with
        ``fit(..., initial_epoch=meta["epoch"])``.

        Returns:
            The checkpoint's metadata (``epoch``, ``step``, ``seed``, ...; ``kind`` is
            ``"adapters"`` for adapters).

        Raises:
            CheckpointError: ``path`` is not a complete easyfit checkpoint, or cannot be
                restored into this trainer (adapters: the model has no LoRA layers, or another
                base, rank or head, named).
        """
        return model_io.load(self, path)

    # -------------------------------------------------------- configuration of the compiled steps
    def _resolved(self, y: Any) -> Resolved:
        """The loss function and metric collection for labels laid out as ``y``."""
        if self.loss is None:
            raise ValueError(
                "the trainer has no loss yet: pass loss= to the Trainer, or call fit or "
                "evaluate first (the loss is then inferred from the labels)"
            )
        return self._steps.resolved(self.loss, self.loss_weights, self.metrics, y)

    def _know(
        self, scale: float | None, class_names: list[str] | None, class_weight: Any = HookValues.KEEP
    ) -> None:
        """Sets what the traced hooks read (one value: the input scale and fit's class weights,
        kept unless given) and the class names, outside fit (which sets its training data's
        once): by an evaluate or predict that makes the state (its data's), by load (the
        checkpoint's)."""
        self._hook_values = self._hook_values.replace(scale, class_weight)
        self.class_names = class_names

    def _functions(
        self, source: Source, plan: Plan, chunk: Mapping[str, Any], verbose: int = 0
    ) -> steps.Compiled:
        """The compiled training and evaluation steps for ``source`` (its input scale) and
        ``plan`` (its steps per dispatch), with the current fit's class weights. The one place
        the loss is inferred from ``source``'s labels when none was given (said in the log, and
        with ``verbose`` on stdout)."""
        if self.loss is None:
            self.loss = self._labels.infer(source, chunk)
        resolved = self._steps.resolved(self.loss, self.loss_weights, self.metrics, chunk["y"])
        class_weight = self._hook_values.class_weight
        if class_weight is not None and is_structured(chunk["y"]):
            raise ValueError(
                "class_weight: the model has several outputs (y is a dict or a tuple); weight "
                "the samples with sample_weight= instead"
            )
        if verbose:
            _say(self._labels.note)
        train: Any = self.train_step
        if self.ema_momentum is not None:  # after any train_step, an override's too
            train = steps.with_ema(train, self.ema_momentum, self.gradient_accumulation_steps)
        return self._steps.training(
            train_step=train,
            compute_loss=self.compute_loss,
            adapter=self._adapter,
            precision=self.precision,
            metrics=resolved.metrics,
            scale=source.scale,
            steps_per_execution=plan.steps_per_execution,
            class_weight=class_weight,
        )

    def _check_class_weight(self, class_weight: Mapping[Any, float] | None, chunk: Mapping[str, Any]) -> None:
        """ValueError for a ``class_weight`` key past the model's classes (its outputs, or 0
        and 1 for a single output), once the state exists."""
        if not class_weight or is_structured(chunk["y"]):
            return
        state = self._require_state()
        size = self._adapter.num_outputs(state.params, state.model_state, input_spec(chunk["x"])[0])
        check_class_weight(class_weight, 2 if size == 1 else int(size))

    def _resume_point(self, callbacks: list[Callback], data: TrainingData) -> ResumePoint | None:
        """Where a ``Resumable`` callback offers to resume fit, checked against the training
        data; with a backup, the data's fingerprint noted (the backups record it)."""
        resume, backed_up = resume_point(callbacks)
        if backed_up:
            self._data_fingerprint = data.fingerprint
            if resume is not None:
                resume.check_data(self._data_fingerprint)
        return resume

    # ------------------------------------------------------------------------------ the state
    def _ensure_state(
        self,
        chunk: Mapping[str, Any],
        source: Source,
        labels_too: bool = True,
        class_weight: Mapping[Any, float] | None = None,
    ) -> None:
        """Creates the state from a first batch (or its ``jax.ShapeDtypeStruct`` spec) if there
        is none, else checks the batch's input shape against the state's; with ``labels_too``,
        checks the source's labels against the loss (once per source) and ``class_weight``'s
        keys against the model's classes."""
        if self.state is None:
            self._init_state(*input_spec(chunk["x"]))
        elif self._input_spec is not None and self._input_spec[1] is not None:  # a shape known
            built, model = self._input_spec[0], self._require_state()
            checks.check_input_shape(
                built,
                input_spec(chunk["x"])[0],
                lambda shape: self._adapter.num_outputs(model.params, model.model_state, shape),
                source.describe(),
            )
        if not labels_too:
            return
        state, shape = self._require_state(), input_spec(chunk["x"])[0]
        outputs = functools.partial(self._adapter.output_shapes, state.params, state.model_state, shape)
        self._labels.check(source, self.loss, outputs, chunk)
        self._check_class_weight(class_weight, chunk)

    def _init_state(self, shape: Any, dtype: Any, abstract: bool = False) -> Any:
        """Creates ``self.state`` for inputs of ``shape`` (one sample's, or a dict or list of
        them: ``easyfit.core.models.input_spec``); with ``abstract``, returns its shapes,
        dtypes and shardings instead, computing nothing (a target to restore a checkpoint to)."""
        self._input_spec = (list(shape) if isinstance(shape, tuple) else shape, dtype)
        maker = self._state_maker()
        make = maker.abstract if abstract else maker.make
        layout = {} if abstract else {"layout": self._layout}
        state = make(self.seed, shape, self._nnx_variables, self.precision.initial_scale(), **layout)
        if abstract:
            return self._layout.abstract(state)
        self.state = self._layout.place(state)
        return self.state

    def _state_maker(self) -> StateMaker:
        """The StateMaker of the current optimizer and EMA setting (one jitted initialisation,
        traced once for its abstract and concrete uses)."""
        ema = self.ema_momentum is not None
        maker = self._maker
        if maker is None or maker.tx is not self.optimizer or maker.ema != ema:
            maker = self._maker = StateMaker(self._adapter, self.optimizer, ema)
        return maker

    def _shapes(self, chunk: Mapping[str, Any], compiled: steps.Compiled) -> tuple[Any, Any]:
        """Shapes, dtypes and shardings of the state (before it exists: no computation) and of
        what ``_empty`` makes: the first step compiles for them with no transfer to the
        devices, which on a GPU waits for the pipelines' first run."""
        if self.state is None:
            state = self._init_state(*input_spec(chunk["x"]), True)
        else:
            state = self.placement.abstract(self.state)
        return state, self.placement.abstract(jax.eval_shape(compiled.metrics.empty), replicated=True)

    def _empty(self, compiled: steps.Compiled) -> Any:  # placed as the steps return them (one compile)
        return self.placement.replicate(compiled.metrics.empty())

    def _require_state(self) -> TrainState:
        if self.state is None:
            raise RuntimeError("the model has no parameters yet: call fit (or evaluate) first")
        return self.state

    def _optimizer_meta(self, opt_state: Any) -> dict[str, Any]:
        return metadata.optimizer_meta(self._optimizer_name, opt_state)


def _say(*notes: str | None) -> None:
    """Prints each note (those not None or empty) on a line of its own, for fit's ``verbose``."""
    for note in notes:
        if note:
            print(f"easyfit: {note}", flush=True)


def _on_host(output: tuple[Any, Any]) -> Any:
    """One dispatch's predictions (``(outputs, mask)``) on the host, padding rows dropped."""
    out, mask = output
    keep = gather_to_host(mask)
    return jax.tree_util.tree_map(lambda o: gather_to_host(o)[keep], out)


def _host_outputs(output: tuple[Any, Any]) -> dict[str, Any]:
    """``on_predict_batch_end``'s logs, as Keras': ``{"outputs": ...}``."""
    return {"outputs": _on_host(output)}
