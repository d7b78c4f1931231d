"""Trainer: configuration, and fit / evaluate / predict that only coordinate.

The work is elsewhere: the data inputs (``easyfit.data.DataInputs``) resolve what to read and
lend streams of global batches, the pure steps (``easyfit.training.steps``) train and evaluate, checkpoints
(``easyfit.persistence.checkpoint``) save plain values, callbacks report (see docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import optax

from .._env import arrange_determinism
from ..callbacks import Callback, CallbackList, History
from ..callbacks.callback_list import LazyLogs, as_list, fit_callbacks
from ..data.inputs import DataInputs
from ..errors import Preempted
from ..parallel import Placement, gather_to_host
from ..persistence import checkpoint
from . import steps
from .args import check_int, check_momentum, check_verbose
from .fit_options import class_weights, validation_epochs
from .input_wait import EpochInputWait
from .interrupt import deferred_signals
from .losses import LossFn, get_loss
from .metrics import compute_on_host, epoch_logs
from .models import adapt, write_back
from .optimizers import accumulating, get_optimizer
from .precision import get_precision
from .state import TrainState
from .trainer_steps import TrainerSteps

if TYPE_CHECKING:
    from ..data.sources.base import Source

__all__ = ["Trainer"]

log = logging.getLogger("easyfit")


class Trainer(TrainerSteps):
    """Trains a Flax model on data read by DALI, Keras style.

    Args:
        model: a ``flax.linen.Module`` (initialised from the first batch's shape) or a
            ``flax.nnx.Module`` (already initialised). A linen module whose ``__call__`` takes
            ``train``, ``training`` or ``deterministic`` gets it set for training and evaluation.
        optimizer: an optax GradientTransformation (default ``optax.adam(1e-3)``), or a Keras
            name with Keras' defaults: ``"adam"``, ``"sgd"``, ``"rmsprop"``, ``"adamw"``,
            ``"adagrad"`` (see ``easyfit.training.optimizers``).
        loss: a Keras loss name (``"sparse_categorical_crossentropy"``,
            ``"categorical_crossentropy"``, ``"binary_crossentropy"``, ``"mse"``, ``"mae"``), a
            function ``(y_true, y_pred) -> per-sample losses`` (Keras' order), or an optax loss
            (called in optax's order; the rule: ``easyfit.training.losses``). Models output logits. None:
            sparse categorical cross-entropy for integer labels (shape ``(n,)`` or ``(n, 1)``),
            categorical cross-entropy for one-hot float labels, mse for other float labels
            (``fit`` says which at ``verbose >= 1``). For a model with several outputs (``y`` a
            dict or a tuple), one loss for all or a dict ``{output: loss}`` (a list for a
            tuple), as in Keras (``easyfit.training.multi_output``).
        metrics: Keras metric names, functions ``(y_true, y_pred) -> per-sample values``
            (called as ``loss`` functions are) or clu metrics (see ``easyfit.training.metrics``).
            None: ``["accuracy"]`` for classification losses, none otherwise. For several
            outputs, a dict ``{output: [metrics]}`` (a list of entries for a tuple).
        loss_weights: for several outputs, a dict ``{output: weight}`` (a list for a tuple)
            multiplying each output's loss in the total, as Keras' ``loss_weights``.
        seed: seeds initialisation, shuffling and dropout: the same seed gives the same
            parameters.
        steps_per_execution: optimizer steps per dispatch (one jitted ``lax.scan``); batch
            callbacks then fire once per dispatch, their ``batch`` counting dispatches where
            Keras counts steps (docs/keras.md). ``"auto"`` (default): on GPUs enough steps per
            dispatch to keep the devices busy, more when training from the device cache, never
            more than an epoch (``easyfit.training.steps.per_dispatch`` gives the rule); on CPUs one
            step, since XLA's CPU convolutions run slower inside a scan (docs/performance.md).
        devices: the devices to train on (default: all of ``jax.devices()``).
        num_threads: DALI threads per pipeline (default: chosen from the cores; see
            docs/performance.md).
        pipelines_per_device: DALI pipelines per GPU (default: chosen from the cores).
        precision: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` (with dynamic loss
            scaling): the dtype of the forward and backward passes; parameters, optimizer state,
            BatchNorm statistics, loss and metrics stay float32 (see ``easyfit.training.precision``).
        deterministic: True asks XLA for runs that repeat bit for bit on a GPU: adds
            ``--xla_gpu_deterministic_ops=true`` to ``XLA_FLAGS`` (deterministic kernels, no
            autotuning by timing), which takes effect only if JAX's backend has not started yet;
            otherwise it warns. DALI's random draws are seeded already. Costs speed on a GPU
            (docs/performance.md); changes nothing on a CPU, where runs repeat bit for bit anyway.
        gradient_accumulation_steps: None (default), or k >= 2: the optimizer updates once
            every k batches, with the mean of their gradients (``optax.MultiSteps``), as
            Keras' optimizer argument. Batches, not updates, are what ``steps_per_epoch``,
            progress, callbacks and ``state.step`` count; BatchNorm statistics move every
            batch (docs/models.md).
        ema_momentum: None (default), or m in [0, 1]: keep an exponential moving average of
            the parameters, updated on the device after every batch (Keras' ``use_ema=True,
            ema_momentum=m``); evaluation (validation in fit too), prediction, export and
            ``trainer.params`` use it, ``trainer.state.params`` stays the raw weights
            (docs/models.md).

    Example:
        >>> import optax, easyfit as ef
        >>> from flax import linen as nn
        >>> class MLP(nn.Module):
        ...     @nn.compact
        ...     def __call__(self, x):
        ...         return nn.Dense(10)(nn.relu(nn.Dense(64)(x.reshape((x.shape[0], -1)))))
        >>> root = ef.datasets.mnist(DOCS_TMP + "/mnist", limit=(200, 50), source=MNIST_IDX)
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
    ):
        if not isinstance(deterministic, bool):
            raise TypeError(f"deterministic={deterministic!r}: must be True or False")
        self.deterministic = deterministic
        if deterministic:  # first: the flag must be in XLA_FLAGS before the backend starts
            arrange_determinism()
        self._adapter, self._nnx_variables = adapt(model)
        self._model = model
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.optimizer = accumulating(get_optimizer(optimizer), gradient_accumulation_steps)
        self.ema_momentum = check_momentum(ema_momentum)
        self._optimizer_name = optimizer if isinstance(optimizer, str) else None
        self._optimizer_given = optimizer is not None
        self._inference_only: str | None = None
        self.loss = loss
        self.loss_weights = loss_weights
        self._loss_note: str | None = None
        self.metrics = metrics
        self.seed = int(seed)
        self.precision = get_precision(precision)
        if steps_per_execution != "auto":
            check_int("steps_per_execution", steps_per_execution, 1)
        self.steps_per_execution = steps_per_execution
        self.placement = Placement.create(devices)
        self.state: TrainState | None = None
        self.stop_training = False
        self.stop_evaluating = False
        self.stop_predicting = False
        self.history: History | None = None
        self.class_names: list[str] | None = None
        self.batch_size = 32
        self._compiled: dict[Any, Any] = {}  # steps.Compiled, and prediction functions
        self._data = DataInputs(
            self.placement,
            self.seed,
            steps_per_execution,
            {"num_threads": num_threads, "pipelines_per_device": pipelines_per_device},
        )
        self._input_spec: tuple[Any, Any] | None = None
        self._tracing = threading.local()  # the step configuration being traced
        self._input_scale: float | None = None  # what the step multiplies inputs by
        self._class_weight: tuple[float, ...] | None = None
        self._loss_fn: LossFn = get_loss("mse")
        self._progress: checkpoint.Progress | None = None
        self._data_fingerprint: dict[str, Any] | None = None  # the last fit's, with a backup

    # ----------------------------------------------------------------------------- public state
    def close(self) -> None:
        """Releases the DALI pipelines, device caches, open files and compiled steps kept between
        passes. The trained state stays; used again, the trainer rebuilds what it needs."""
        self._data.close()
        self._compiled.clear()

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
        shuffle: bool = True,
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
                (seeded by ``seed``: the same samples on every run and device count); it
                replaces a folder found beside ``train/``.
            callbacks: ``easyfit.callbacks.Callback`` instances (any iterable, read once, or
                one Callback), called in this order, then a History (unless one is given: fit
                returns it) and the progress bar.
            verbose: 0 silent, 1 progress bar (a line per epoch when stdout is not a terminal),
                2 a line per epoch.
            shuffle: a fresh permutation of the whole dataset every epoch.
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
        self._check_trainable()
        check_int("batch_size", batch_size, 1, none=True)
        check_int("epochs", epochs, 0)
        check_int("initial_epoch", initial_epoch, 0)
        check_int("steps_per_epoch", steps_per_epoch, 1, none=True)
        check_int("validation_steps", validation_steps, 1, none=True)
        verbose = check_verbose(verbose) if jax.process_index() == 0 else 0  # process 0 reports
        self._class_weight = class_weights(class_weight)
        validates = validation_epochs(validation_freq)
        train, val = self._data.fit_sources(x, y, validation_data, validation_split, sample_weight)
        self.class_names = train.class_names
        batch_size = int(batch_size or self.batch_size)
        self.batch_size = batch_size
        callbacks = as_list(callbacks)
        resume = checkpoint.find_resume_point(callbacks)
        if any(hasattr(cb, "restore_point") for cb in callbacks):  # a backup: note the data
            self._data_fingerprint = checkpoint.data_fingerprint(train)
            if resume is not None:
                resume.check_data(self._data_fingerprint)
        loader, why = self._data.train_loader(
            train,
            batch_size,
            shuffle=shuffle,
            cache=cache,
            initial_epoch=initial_epoch,
            resume=resume,
            steps_per_epoch=steps_per_epoch,
        )
        if verbose and cache == "auto":
            print(f"easyfit: {why}", flush=True)
        if resume is not None:
            initial_epoch = resume.epoch
        plan = loader.plan
        start = dict(loader.position())  # read now: the stream moves on at once
        compiling: dict[int, threading.Thread] = {}
        try:  # a failure before training (bad labels or inputs) leaves nothing running
            head: dict[str, jax.Array] = next(loader)
            first: dict | None = head  # the first step's chunk, already read
            fns = self._functions(train, plan, head)
            if verbose and self._loss_note:
                print(f"easyfit: {self._loss_note}", flush=True)
            # the steps trained by the first chunk, by most and by an epoch's last one (fewer when
            # the steps do not divide evenly): the first chunk's function compiled while the model
            # initialises, the others after it, while the first chunks train (two compilations at
            # once stalled on a GPU)
            first_count = plan.live_steps(resume.batch if resume is not None else 0)
            abstract, empty = self._abstract_state(head), self._empty(fns)
            compiling[first_count] = steps.compile_ahead(fns.train(first_count), abstract, empty, head)
            self._ensure_state(head, train)
            self._check_class_weight(class_weight, head)
            compiling[first_count].join()
            ends = {plan.live_steps(0), plan.live_steps(plan.chunks_per_epoch - 1)}
            others = [n for n in ends if n != first_count]
            if others:
                later = steps.compile_ahead([fns.train(n) for n in others], abstract, empty, head)
                compiling.update(dict.fromkeys(others, later))
        except BaseException:
            for thread in compiling.values():
                thread.join()
            loader.close()
            raise
        acc = None
        first_batch = 0
        if resume is not None:
            self.state, acc = resume.restore(self.state, self._empty(fns))
            first_batch = resume.batch
        self._progress = checkpoint.Progress(initial_epoch, first_batch, start, acc, plan)
        listed, history = fit_callbacks(callbacks, verbose)
        cbs = CallbackList(
            listed,
            self,
            {"epochs": epochs, "steps": plan.chunks_per_epoch, "verbose": verbose, "batch_size": batch_size},
        )
        self.history = history
        self.stop_training = False
        logs: dict[str, float] = {}
        try:
            cbs.call("on_train_begin")  # in the try: on_train_end lets go of what it took
            with deferred_signals() as interrupted:
                for epoch in range(initial_epoch, epochs):
                    cbs.call("on_epoch_begin", epoch)
                    waiting = EpochInputWait(loader)
                    if acc is None:
                        acc = self._empty(fns)
                    for batch in range(first_batch, plan.chunks_per_epoch):
                        chunk = first if first is not None else next(loader)
                        first = None
                        cbs.call("on_train_batch_begin", batch)
                        live = plan.live_steps(batch)
                        compiling[live].join()
                        self.state, acc = fns.train(live)(self.state, acc, chunk)
                        self._progress = checkpoint.Progress(epoch, batch + 1, loader.position(), acc, plan)
                        if cbs.wants("on_train_batch_end"):
                            cbs.call(
                                "on_train_batch_end",
                                batch,
                                logs=LazyLogs(functools.partial(compute_on_host, acc)),
                            )
                        if self.stop_training or interrupted():
                            break
                    else:
                        position = start if first is not None else loader.position()
                        self._progress = checkpoint.Progress(epoch + 1, 0, position, None, plan)
                    if interrupted():
                        raise interrupted.exception()
                    logs = epoch_logs(acc, self.state)
                    steady = initial_epoch + loader.warmup_epochs  # the first epoch as others
                    logs["input_wait"] = waiting.finish(epoch, bool(verbose) and epoch == steady)
                    acc = None
                    first_batch = 0
                    if val is not None and validates(epoch):
                        val_logs = self._evaluate(val, batch_size, cbs, validation_steps)
                        logs.update({f"val_{k}": v for k, v in val_logs.items()})
                    cbs.call("on_epoch_end", epoch, logs=logs)
                    if interrupted():
                        raise interrupted.exception()
                    if self.stop_training:
                        break
        except (KeyboardInterrupt, Preempted):
            cbs.call("on_interrupt", logs=logs)
            raise
        finally:
            for thread in compiling.values():  # not left compiling when the interpreter exits
                thread.join()
            loader.close()
            try:
                cbs.call_all("on_train_end", logs=logs)  # every callback, even after one raised
            finally:
                write_back(self._model, self.state)  # the user's NNX module holds the trained state
        checkpoint.fit_completed(callbacks)  # only now may a backup go (BackupAndRestore)
        return history

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, model: Any, **kwargs: Any) -> Trainer:
        """A Trainer for ``model`` (built with ``kwargs``) holding the checkpoint at ``path``,
        reading data as the training data was read (the checkpoint's input recipe).

        Without ``optimizer=``, a checkpoint saved with another optimizer than the default
        loads its weights for inference (evaluate, predict, export); ``fit`` then says which
        optimizer to pass. With one that differs from the saved one: CheckpointError naming
        both."""
        trainer = cls(model, **kwargs)
        trainer.load(path)
        return trainer

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
            verbose: 1 prints the result.
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
        batch_size = int(batch_size or self.batch_size)
        logs = self._evaluate(source, batch_size, CallbackList(as_list(callbacks), self, {}), steps)
        if verbose and jax.process_index() == 0:
            print(" - ".join(f"{k}: {v:.4f}" for k, v in logs.items()), flush=True)
        return logs if return_dict else logs["loss"] if len(logs) == 1 else list(logs.values())

    @contextlib.contextmanager
    def _pass(
        self, source: Source, batch_size: int, predict: bool = False, steps: int | None = None
    ) -> Iterator[tuple[Any, Any]]:
        """A leased loader over ``source`` (its first ``steps`` batches) and the compiled steps
        for it (``evaluate``), or with ``predict`` the prediction function (no labels: no loss)."""
        with self._data.lease(source, batch_size, steps) as loader:
            first = loader.peek()
            self._ensure_state(first, source, labels=not predict)
            if predict:
                yield loader, self._predictor(source, loader.plan)
            else:
                yield loader, self._functions(source, loader.plan, first)

    def _evaluate(
        self, source: Source, batch_size: int, cbs: CallbackList, steps: int | None = None
    ) -> dict[str, float]:
        with self._pass(source, batch_size, steps=steps) as (loader, fns):
            self.stop_evaluating = False
            cbs.call("on_test_begin")
            acc = self._empty(fns)
            for batch in range(loader.plan.chunks_per_epoch):
                cbs.call("on_test_batch_begin", batch)
                acc = fns.eval(self.state, acc, next(loader))
                if cbs.wants("on_test_batch_end"):
                    running = LazyLogs(functools.partial(compute_on_host, acc))
                    cbs.call("on_test_batch_end", batch, logs=running)
                if self.stop_evaluating:
                    break
            logs = compute_on_host(acc)
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

        For a folder: sorted class folders, sorted files (``ImageFolder.files``). ``x`` may be
        a dict or a tuple of arrays (several inputs). ``steps``: the outputs of the first that
        many batches only, as Keras (default, or more than there are: every sample). Paths and
        arrays are read as the training data was (its input recipe, also after a load): after
        training on images, a uint8 array of images is resized, center-cropped, scaled and
        normalised as the image files were, and a float array is taken as already prepared;
        after training on arrays, their ``scale`` applies. A source given as ``x`` is read as it
        is configured.

        Returns:
            A NumPy array with one row per sample; for a model with several outputs, a dict or
            a tuple of them.
        """
        del verbose
        check_int("batch_size", batch_size, 1, none=True)
        check_int("steps", steps, 1, none=True)
        source = self._data.source(x, inputs_only=True)
        batch_size = int(batch_size or self.batch_size)
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


def _on_host(output: tuple[Any, Any]) -> Any:
    """One dispatch's predictions (``(outputs, mask)``) on the host, padding rows dropped."""
    out, mask = output
    keep = gather_to_host(mask)
    return jax.tree_util.tree_map(lambda o: gather_to_host(o)[keep], out)


def _host_outputs(output: tuple[Any, Any]) -> dict[str, Any]:
    """``on_predict_batch_end``'s logs, as Keras': ``{"outputs": ...}``."""
    return {"outputs": _on_host(output)}
