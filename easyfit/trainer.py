"""Trainer: configuration, and fit / evaluate / predict that only coordinate.

The work is elsewhere: the data door (``easyfit.data.DataDoor``) resolves what to read and lends
loaders of global batches, the pure steps (``easyfit.steps``) train and evaluate, checkpoints
(``easyfit.checkpoint``) save plain values, callbacks report (see docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from . import checkpoint, steps
from . import export as export_lib
from ._fit_options import class_weights, validation_epochs
from ._input_wait import EpochInputWait
from ._interrupt import deferred_sigint
from .callbacks import Callback, CallbackList, History, ProgbarLogger
from .callbacks.callback_list import LazyLogs
from .data.door import DataDoor
from .data.order import Plan
from .data.sources.base import Source
from .errors import CheckpointError
from .learning_rate import get_learning_rate
from .losses import LossFn, get_loss
from .metrics import build_collection, compute_on_host
from .models import adapt
from .parallel import Placement, gather_to_host
from .precision import get_precision
from .state import TrainState

__all__ = ["Trainer"]

log = logging.getLogger("easyfit")

_CLASSIFICATION = ("sparse_categorical_crossentropy", "categorical_crossentropy",
                   "binary_crossentropy")


@dataclasses.dataclass(frozen=True)
class _Compiled:
    train: Callable
    eval: Callable
    predict: Callable
    metrics: type


class Trainer:
    """Trains a Flax model on data read by DALI, Keras style.

    Args:
        model: a ``flax.linen.Module`` (initialised from the first batch's shape) or a
            ``flax.nnx.Module`` (already initialised). A linen module whose ``__call__`` takes
            ``train``, ``training`` or ``deterministic`` gets it set for training and evaluation.
        optimizer: an optax GradientTransformation (default ``optax.adam(1e-3)``).
        loss: a Keras loss name (``"sparse_categorical_crossentropy"``,
            ``"categorical_crossentropy"``, ``"binary_crossentropy"``, ``"mse"``, ``"mae"``) or a
            callable ``(outputs, labels) -> per-sample losses``. Models output logits. None:
            sparse categorical cross-entropy for integer labels, mse for float labels.
        metrics: Keras metric names, callables or clu metrics (see ``easyfit.metrics``).
            None: ``["accuracy"]`` for classification losses, none otherwise.
        seed: seeds initialisation, shuffling and dropout: the same seed gives the same
            parameters.
        steps_per_execution: optimizer steps per dispatch (one jitted ``lax.scan``); batch
            callbacks then fire every that many steps. ``"auto"`` (default): on GPUs about 6,000
            samples per dispatch when streaming and about 12,800 when training from the device
            cache, never more than an epoch; on CPUs one step, since XLA's CPU convolutions
            run slower inside a scan (the measurements: docs/performance.md).
        devices: the devices to train on (default: all of ``jax.devices()``).
        num_threads: DALI threads per pipeline (default: chosen from the cores; see
            docs/performance.md).
        pipelines_per_device: DALI pipelines per GPU (default: chosen from the cores).
        precision: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` (with dynamic loss
            scaling): the dtype of the forward and backward passes; parameters, optimizer state,
            BatchNorm statistics, loss and metrics stay float32 (see ``easyfit.precision``).

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

    def __init__(self, model: Any, optimizer: optax.GradientTransformation | None = None,
                 loss: str | LossFn | None = None, metrics: Sequence[Any] | Mapping[str, Any] |
                 None = None, *, seed: int = 0, steps_per_execution: int | str = "auto",
                 devices: Sequence[jax.Device] | None = None, num_threads: int | None = None,
                 pipelines_per_device: int | None = None, precision: str = "float32"):
        self._adapter, self._nnx_variables = adapt(model)
        self._model = model
        self.optimizer = optimizer if optimizer is not None else optax.adam(1e-3)
        self.loss = loss
        self.metrics = metrics
        self.seed = int(seed)
        self.precision = get_precision(precision)
        if steps_per_execution != "auto" and (not isinstance(steps_per_execution, int)
                                               or steps_per_execution < 1):
            raise ValueError(f"steps_per_execution={steps_per_execution!r}: expected 'auto' "
                             "or an integer >= 1")
        self.steps_per_execution = steps_per_execution
        self.placement = Placement.create(devices)
        self.state: TrainState | None = None
        self.stop_training = False
        self.history: History | None = None
        self.class_names: list[str] | None = None
        self.batch_size = 32
        self._compiled: dict[Any, _Compiled] = {}
        self._data = DataDoor(self.placement, self.seed, steps_per_execution,
                              {"num_threads": num_threads,
                               "pipelines_per_device": pipelines_per_device})
        self._input_spec: tuple[list[int], str] | None = None
        self._input_scale: float | None = None  # what the step multiplies inputs by
        self._class_weight: tuple[float, ...] | None = None
        self._loss_fn: LossFn = get_loss("mse")
        self._progress: checkpoint.Progress | None = None

    # ----------------------------------------------------------------------------- public state
    @property
    def params(self) -> Any:
        """The trained parameters (a pytree of jax.Arrays; an ``nnx.State`` for NNX models)."""
        self._require_state()
        return self.state.params

    @property
    def model(self) -> Any:
        """The model. For NNX, the module with the trained state merged back in."""
        if self._adapter.kind == "nnx" and self.state is not None:
            return nnx.merge(self._adapter.module, jax.device_get(self.state.params),
                             jax.device_get(self.state.model_state))
        return self._model

    @property
    def progress(self) -> checkpoint.Progress | None:
        """Where the current (or last) fit stands: epoch, batch, loader position (what a
        checkpoint records)."""
        return self._progress

    @property
    def checkpoint_meta(self) -> dict[str, Any]:
        """What a checkpoint records beside the state and the progress: the seed, the input
        shape and dtype, the class names."""
        shape, dtype = self._input_spec or (None, None)
        return {"seed": self.seed, "input_shape": shape, "input_dtype": dtype,
                "input_scale": self._input_scale, "class_names": self.class_names,
                "precision": self.precision.name}

    # ------------------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Releases the DALI pipelines, device caches and open files kept for evaluation and
        prediction, and the compiled steps. The trained state stays; the trainer can be used
        again (it rebuilds what it needs)."""
        self._data.close()
        self._compiled.clear()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ fit
    def fit(self, x: Any = None, y: Any = None, *, batch_size: int | None = None, epochs: int = 1,
            validation_data: Any = None, validation_split: float = 0.0,
            callbacks: Sequence[Callback] | None = None, verbose: int = 1, shuffle: bool = True,
            initial_epoch: int = 0, cache: bool | str = "auto",
            class_weight: Mapping[int, float] | None = None,
            validation_freq: int | Sequence[int] = 1) -> History:
        """Trains for ``epochs`` epochs.

        Args:
            x: a folder (``root/train`` + ``root/val`` layout, or ``root/<class>/*`` alone), an
                ``easyfit.data`` source, or an array of inputs.
            y: labels, when ``x`` is an array.
            batch_size: global batch size, split over all devices (default 32); must divide by
                the number of devices.
            epochs: index of the last epoch (as in Keras, with ``initial_epoch``).
            validation_data: a folder, a source or ``(x_val, y_val)``; overrides the folder
                found beside ``train/`` and ``validation_split``.
            validation_split: hold this fraction of the training data out for validation
                (seeded by ``seed``: the same samples on every run and device count); it
                replaces a folder found beside ``train/``.
            callbacks: ``easyfit.callbacks.Callback`` instances.
            verbose: 0 silent, 1 progress bar (a line per epoch when stdout is not a terminal),
                2 a line per epoch.
            shuffle: a fresh permutation of the whole dataset every epoch.
            initial_epoch: the epoch to start from (resuming).
            cache: ``"auto"`` keeps the decoded dataset in device memory after the first epoch
                when it fits (see ``easyfit.data.cache``) and no random augmentation is asked
                for, and says what it chose in the log; True insists, False always streams.
            class_weight: ``{class index: weight}`` multiplying each training sample's loss.
            validation_freq: validate every that many epochs, or at the (1-based) epochs
                listed; History holds ``val_*`` for those epochs only.

        A callback with a ``restore_point()`` method (``BackupAndRestore``) may make fit resume
        where an earlier run stopped, mid-epoch included; see ``easyfit.checkpoint.ResumePoint``.
        On Ctrl-C, fit stops after the step in progress, calls the callbacks' ``on_interrupt``
        and ``on_train_end``, then lets the KeyboardInterrupt through.

        Returns:
            The History of this fit (also ``trainer.history``).
        """
        verbose = verbose if jax.process_index() == 0 else 0  # only process 0 reports
        self._class_weight = class_weights(class_weight)
        validates = validation_epochs(validation_freq)
        train, val = self._data.fit_sources(x, y, validation_data, validation_split)
        self.class_names = train.class_names
        batch_size = int(batch_size or self.batch_size)
        self.batch_size = batch_size
        resume = checkpoint.find_resume_point(callbacks or [])
        loader, why = self._data.train_loader(train, batch_size, shuffle=shuffle, cache=cache,
                                              initial_epoch=initial_epoch, resume=resume)
        if verbose and cache == "auto":
            print(f"easyfit: {why}", flush=True)
        if resume is not None:
            initial_epoch = resume.epoch
        plan = loader.plan
        start = loader.position()
        first: dict | None = next(loader)
        fns = self._functions(train, plan)
        compiling = steps.compile_ahead(fns.train, self._abstract_state(first), self._empty(fns),
                                        first)  # while the model initialises
        self._ensure_state(first, train)
        compiling.join()
        acc = None
        first_batch = 0
        if resume is not None:
            self.state, acc = resume.restore(self.state, self._empty(fns))
            first_batch = resume.batch
        self._progress = checkpoint.Progress(initial_epoch, first_batch, start, acc, plan)
        history = History()
        cbs = CallbackList([history, *([ProgbarLogger(verbose)] if verbose else []),
                            *(callbacks or [])], self,
                           {"epochs": epochs, "steps": plan.chunks_per_epoch, "verbose": verbose,
                            "batch_size": batch_size})
        self.history = history
        self.stop_training = False
        logs: dict[str, float] = {}
        cbs.call("on_train_begin")
        try:
            with deferred_sigint() as interrupted:
                for epoch in range(initial_epoch, epochs):
                    cbs.call("on_epoch_begin", epoch)
                    waiting = EpochInputWait(loader)
                    if acc is None:
                        acc = self._empty(fns)
                    for batch in range(first_batch, plan.chunks_per_epoch):
                        chunk = first if first is not None else next(loader)
                        first = None
                        cbs.call("on_train_batch_begin", batch)
                        self.state, acc = fns.train(self.state, acc, chunk)
                        self._progress = checkpoint.Progress(epoch, batch + 1, loader.position(),
                                                             acc, plan)
                        if cbs.wants("on_train_batch_end"):
                            cbs.call("on_train_batch_end", batch,
                                     logs=LazyLogs(lambda a=acc: compute_on_host(a)))
                        if self.stop_training or interrupted():
                            break
                    else:
                        position = start if first is not None else loader.position()
                        self._progress = checkpoint.Progress(epoch + 1, 0, position, None, plan)
                    if interrupted():
                        raise KeyboardInterrupt
                    logs = self._epoch_logs(acc)
                    steady = initial_epoch + loader.warmup_epochs  # the first epoch as others
                    logs["input_wait"] = waiting.finish(epoch, bool(verbose) and epoch == steady)
                    acc = None
                    first_batch = 0
                    if val is not None and validates(epoch):
                        val_logs = self._evaluate(val, batch_size, cbs)
                        logs.update({f"val_{k}": v for k, v in val_logs.items()})
                    cbs.call("on_epoch_end", epoch, logs=logs)
                    if interrupted():
                        raise KeyboardInterrupt
                    if self.stop_training:
                        break
        except KeyboardInterrupt:
            cbs.call("on_interrupt", logs=logs)
            raise
        finally:
            loader.close()
            cbs.call("on_train_end", logs=logs)
        return history

    def _epoch_logs(self, acc: Any) -> dict[str, float]:
        logs = compute_on_host(acc)
        learning_rate = get_learning_rate(self.state.opt_state)
        if learning_rate is not None:
            logs["learning_rate"] = learning_rate
        if self.state.dynamic_scale is not None:
            logs["loss_scale"] = float(jax.device_get(self.state.dynamic_scale.scale))
        return logs

    def summary(self, print_fn: Callable[[str], Any] | None = print) -> str:
        """Prints (with ``print_fn``) and returns the table of the model's parameters per
        module, with shapes and sizes, and the totals: trainable, non-trainable (BatchNorm
        statistics, ...) and bytes (see ``easyfit.export.summary``)."""
        self._require_state()
        text = export_lib.summary(self.state.params, self.state.model_state,
                                  type(self._model).__name__)
        if print_fn is not None:
            print_fn(text)
        return text

    def export(self, path: str | os.PathLike) -> str:
        """Writes the inference function, the trained weights inside, as serialized StableHLO
        (``jax.export``) with the class names: it runs with JAX alone, for any batch size, on
        inputs as the source delivers them (see ``easyfit.export.load_exported``)."""
        self._require_state()
        shape, dtype = self._input_spec or ([], "float32")
        infer = steps.make_infer(self._adapter, self._input_scale, self.precision)
        state = jax.device_get(self.state)
        return export_lib.export(path, lambda x: infer(state, x), shape, dtype or "float32",
                                 self.class_names)

    # ---------------------------------------------------------------------------- checkpoints
    def save(self, path: str | os.PathLike, *, weights_only: bool = False) -> str:
        """Writes an Orbax checkpoint: parameters, optimizer state, step, RNG key, the epoch
        reached and the seed (see ``easyfit.checkpoint``). Replaces a checkpoint already at
        ``path`` only once the new one is complete.

        Args:
            path: the checkpoint's directory.
            weights_only: save the parameters (and model state) only.

        Returns:
            The absolute path written.
        """
        self._require_state()
        return checkpoint.save(path, self.state, self._progress, self.checkpoint_meta,
                               weights_only=weights_only)

    def load(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restores a checkpoint written by :meth:`save` (or ``ModelCheckpoint``).

        The trainer must have been built with the same model and optimizer. Continue training
        with ``fit(..., initial_epoch=meta["epoch"])``.

        A full checkpoint also restores the seed, the class names and the epoch reached.

        Returns:
            The checkpoint's metadata (``epoch``, ``step``, ``seed``, ...).

        Raises:
            CheckpointError: ``path`` is not a complete easyfit checkpoint, or cannot be
                restored into this trainer.
        """
        meta = checkpoint.read_metadata(path)
        target = self.state
        if target is None:  # a full checkpoint needs only the shapes; weights need a whole state
            if meta["input_shape"] is None and self._adapter.kind != "nnx":
                raise CheckpointError(f"{os.path.abspath(os.fspath(path))}: no input shape "
                                      "recorded; call fit or evaluate first")
            target = self._init_state(tuple(meta["input_shape"] or ()), meta["input_dtype"],
                                      abstract=meta["kind"] == "full")
        self.state, _ = checkpoint.restore(checkpoint.reader(path), target, meta)
        if meta["class_names"] is not None:
            self.class_names = list(meta["class_names"])
        self._input_scale = meta.get("input_scale")
        if meta["kind"] == "full":
            self.seed = int(meta["seed"])
            self._data.seed = self.seed
            self._progress = checkpoint.Progress(meta["epoch"])
        return meta

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, model: Any, **kwargs: Any) -> Trainer:
        """A Trainer for ``model`` (built with ``kwargs``) holding the checkpoint at ``path``."""
        trainer = cls(model, **kwargs)
        trainer.load(path)
        return trainer

    # ------------------------------------------------------------------------------- evaluate
    def evaluate(self, x: Any, y: Any = None, *, batch_size: int | None = None,
                 callbacks: Sequence[Callback] | None = None, verbose: int = 0) -> dict[str, float]:
        """Loss and metrics over every sample of ``x`` exactly once.

        Args:
            x: a folder, a source, or arrays (with ``y``).
            y: labels, when ``x`` is an array.
            batch_size: global batch size (default: the last fit's).
            callbacks: callbacks whose ``on_test_*`` hooks run.
            verbose: 1 prints the result.

        Returns:
            ``{"loss": ..., "accuracy": ..., ...}``.
        """
        source = self._data.source(x, y)
        batch_size = int(batch_size or self.batch_size)
        logs = self._evaluate(source, batch_size, CallbackList(callbacks or [], self, {}))
        if verbose and jax.process_index() == 0:
            print(" - ".join(f"{k}: {v:.4f}" for k, v in logs.items()), flush=True)
        return logs

    def _evaluate(self, source: Source, batch_size: int, cbs: CallbackList) -> dict[str, float]:
        with self._data.lease(source, batch_size) as loader:
            first = loader.peek()
            self._ensure_state(first, source)
            fns = self._functions(source, loader.plan)
            cbs.call("on_test_begin")
            acc = self._empty(fns)
            for batch in range(loader.plan.chunks_per_epoch):
                cbs.call("on_test_batch_begin", batch)
                acc = fns.eval(self.state, acc, next(loader))
                cbs.call("on_test_batch_end", batch)
            logs = compute_on_host(acc)
        cbs.call("on_test_end", logs=logs)
        return logs

    # -------------------------------------------------------------------------------- predict
    def predict(self, x: Any, *, batch_size: int | None = None,
                callbacks: Sequence[Callback] | None = None, verbose: int = 0) -> np.ndarray:
        """Model outputs for every sample of ``x``, once each, in the source's order.

        For a folder that is the reader's file order: sorted class folders, sorted files
        (``ImageFolder.files``).

        Returns:
            A NumPy array with one row per sample.
        """
        del verbose
        source = self._data.source(x)
        batch_size = int(batch_size or self.batch_size)
        cbs = CallbackList(callbacks or [], self, {})
        outputs = []
        with self._data.lease(source, batch_size) as loader:
            self._ensure_state(loader.peek(), source)
            fns = self._functions(source, loader.plan)
            cbs.call("on_predict_begin")
            for batch in range(loader.plan.chunks_per_epoch):
                cbs.call("on_predict_batch_begin", batch)
                outputs.append(fns.predict(self.state, next(loader)))
                cbs.call("on_predict_batch_end", batch)
        result = np.concatenate([gather_to_host(out)[gather_to_host(mask)]
                                 for out, mask in outputs])
        cbs.call("on_predict_end")
        return result

    # ------------------------------------------------------------------------------ internals
    def _resolved_loss(self, source: Source) -> LossFn:
        if self.loss is None:
            integer = np.issubdtype(source.label_dtype, np.integer)
            self.loss = "sparse_categorical_crossentropy" if integer else "mse"
        return get_loss(self.loss)

    def compute_loss(self, outputs: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        """Per-sample losses of a batch (``x``, ``y``, ``mask``), inside the jitted steps.

        Override it in a subclass to change the loss and nothing else (see docs/models.md):
        easyfit averages it over the valid rows and applies ``class_weight`` when training.
        """
        return self._loss_fn(outputs, batch["y"])

    def _functions(self, source: Source, plan: Plan) -> _Compiled:
        key = (source.scale, plan.steps_per_execution, self._class_weight)
        if key not in self._compiled:
            self._loss_fn = self._resolved_loss(source)
            loss_fn = self.compute_loss
            weights = None if self._class_weight is None else jnp.asarray(self._class_weight)
            metrics = self.metrics
            if metrics is None:
                metrics = ["accuracy"] if self.loss in _CLASSIFICATION else []
            collection = build_collection(metrics)
            k = plan.steps_per_execution
            placement = self.placement
            p = self.precision
            train_step = steps.make_train_step(self._adapter, self.optimizer, loss_fn, collection,
                                               source.scale, p, weights)
            eval_step = steps.make_eval_step(self._adapter, loss_fn, collection, source.scale, p)
            self._compiled[key] = _Compiled(
                train=steps.compile_train(train_step, placement, k),
                eval=steps.compile_eval(eval_step, placement, k),
                predict=steps.compile_predict(self._adapter, source.scale, placement, k, p),
                metrics=collection)
        return self._compiled[key]

    def _abstract_state(self, chunk: Mapping[str, jax.Array]) -> Any:
        """Shapes, dtypes and shardings of the state, before it exists (no computation)."""
        if self.state is None:
            return self._init_state(tuple(chunk["x"].shape[1:]), str(chunk["x"].dtype), True)
        return jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), self.state)

    def _empty(self, fns: _Compiled) -> Any:
        """Empty metrics, placed as the steps return them (else the first call compiles apart)."""
        return self.placement.replicate(fns.metrics.empty())

    def _ensure_state(self, chunk: Mapping[str, jax.Array], source: Source) -> None:
        if self.state is None:
            self._init_state(tuple(chunk["x"].shape[1:]), str(chunk["x"].dtype))
            if self.class_names is None:
                self.class_names = source.class_names
            self._input_scale = source.scale
        self._resolved_loss(source)  # sets self.loss when it was None
        self._data.check_labels(source, self.loss, lambda: self._num_outputs(chunk), chunk)

    def _num_outputs(self, chunk: Mapping[str, jax.Array]) -> int:
        """Size of the model's last output axis for inputs like ``chunk``'s (no computation)."""
        x = jax.ShapeDtypeStruct((1, *chunk["x"].shape[1:]), jnp.float32)
        out = jax.eval_shape(lambda p, m, x: self._adapter.apply(p, m, x, False)[0],
                             self.state.params, self.state.model_state, x)
        return out.shape[-1]

    def _init_state(self, shape: tuple[int, ...], dtype: str | None,
                    abstract: bool = False) -> Any:
        """Creates ``self.state`` for inputs of ``shape``; with ``abstract``, returns its shapes,
        dtypes and shardings instead, computing nothing (a target to restore a checkpoint to)."""
        self._input_spec = (list(shape), dtype)
        init_rng, train_rng = jax.random.split(jax.random.PRNGKey(self.seed))
        if self._adapter.kind == "nnx":
            params, model_state = self._nnx_variables
        else:
            sample = jnp.zeros((1, *shape), jnp.float32)
            init = jax.jit(self._adapter.init) if not abstract else functools.partial(
                jax.eval_shape, self._adapter.init)
            params, model_state = init(init_rng, sample)
        opt_state = (jax.eval_shape if abstract else lambda f, p: f(p))(self.optimizer.init, params)
        state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state,
                           model_state=model_state, rng=train_rng,
                           dynamic_scale=self.precision.initial_scale())
        if abstract:
            rep = self.placement.replicated
            return jax.tree_util.tree_map(
                lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), state)
        self.state = self.placement.replicate(state)
        return self.state

    def _require_state(self) -> None:
        if self.state is None:
            raise RuntimeError("the model has no parameters yet: call fit (or evaluate) first")
