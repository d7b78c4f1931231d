"""The trainer's state and what keeps it: parameters, checkpoints, summary and export.

:class:`TrainerState` is the part of :class:`easyfit.Trainer` (a base class, as Keras' ``Model``
takes its training methods from a ``Trainer`` base) that creates ``trainer.state`` and saves,
loads, summarises and exports it. The training loops are in ``easyfit/trainer.py``.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

import jax
from flax import nnx

from . import checkpoint, steps
from . import export as export_lib
from .errors import CheckpointError
from .models import write_back
from .state import TrainState, create_state

if TYPE_CHECKING:
    import optax

    from .data.door import DataDoor
    from .models import ModelAdapter
    from .parallel import Placement
    from .precision import Precision

__all__ = ["TrainerState"]


class TrainerState:
    """The trained state of a :class:`easyfit.Trainer` and its persistence (see there)."""

    state: TrainState | None
    seed: int
    class_names: list[str] | None
    _progress: checkpoint.Progress | None
    _input_spec: tuple[Any, Any] | None  # one sample's shape and dtype (see models.input_spec)
    _input_scale: float | None
    _adapter: ModelAdapter
    _model: Any
    _nnx_variables: Any
    _data: DataDoor
    optimizer: optax.GradientTransformation
    placement: Placement
    precision: Precision

    @property
    def params(self) -> Any:
        """The trained parameters (a pytree of jax.Arrays; an ``nnx.State`` for NNX models)."""
        return self._require_state().params

    @property
    def model(self) -> Any:
        """The model. For NNX, the module with the trained state merged back in."""
        if self._adapter.kind == "nnx" and self.state is not None:
            return nnx.merge(
                self._adapter.module, *jax.device_get((self.state.params, self.state.model_state))
            )
        return self._model

    @property
    def progress(self) -> checkpoint.Progress | None:
        """Where the current (or last) fit stands: epoch, batch, loader position."""
        return self._progress

    @property
    def checkpoint_meta(self) -> dict[str, Any]:
        """What a checkpoint records beside the state and the progress: the seed, the input
        shape and dtype, the class names."""
        shape, dtype = self._input_spec or (None, None)
        return {
            "seed": self.seed,
            "input_shape": shape,
            "input_dtype": dtype,
            "input_scale": self._input_scale,
            "class_names": self.class_names,
            "precision": self.precision.name,
        }

    def summary(self, print_fn: Any = None) -> None:
        """Prints the parameter table per module and the totals: trainable, non-trainable
        (BatchNorm statistics) and bytes. Returns None, as Keras' ``Model.summary``.

        Args:
            print_fn: called once with the whole text (None: ``print``); e.g.
                ``lines.append`` to keep it.
        """
        state = self._require_state()
        export_lib.summary(state.params, state.model_state, type(self._model).__name__, print_fn or print)

    def export(self, path: str | os.PathLike) -> str:
        """Writes the inference function with the trained weights as serialized StableHLO and
        the class names: it runs with JAX alone, for any batch size (``easyfit.export``)."""
        infer = steps.make_infer(self._adapter, self._input_scale, self.precision)
        shape, dtype = self._input_spec or ([], None)
        return export_lib.export(
            path,
            functools.partial(infer, jax.device_get(self._require_state())),
            shape,
            dtype,
            self.class_names,
        )

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
        return checkpoint.save(
            path, self._require_state(), self._progress, self.checkpoint_meta, weights_only=weights_only
        )

    def load(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restores a checkpoint written by ``save`` (or ``ModelCheckpoint``).

        The trainer must have the same model and optimizer. A full checkpoint also restores the
        seed, the class names and the epoch: go on with ``fit(..., initial_epoch=meta["epoch"])``.

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
                raise CheckpointError(
                    f"{os.path.abspath(os.fspath(path))}: no input shape recorded; call fit or evaluate first"
                )
            target = self._init_state(
                meta["input_shape"] or [], meta["input_dtype"], abstract=meta["kind"] == "full"
            )
        self.state, _ = checkpoint.restore(checkpoint.reader(path), target, meta)
        if meta["class_names"] is not None:
            self.class_names = list(meta["class_names"])
        self._input_scale = meta.get("input_scale")
        if meta["kind"] == "full":
            self.seed = int(meta["seed"])
            self._data.seed = self.seed
            self._progress = checkpoint.Progress(meta["epoch"])
        write_back(self._model, self.state)
        return meta

    def _init_state(self, shape: Any, dtype: Any, abstract: bool = False) -> Any:
        """Creates ``self.state`` for inputs of ``shape`` (one sample's, or a dict or list of
        them: ``easyfit.models.input_spec``); with ``abstract``, returns its shapes, dtypes and
        shardings instead, computing nothing (a target to restore a checkpoint to)."""
        self._input_spec = (list(shape) if isinstance(shape, tuple) else shape, dtype)
        state = create_state(
            self._adapter,
            self.optimizer,
            self.seed,
            shape,
            self._nnx_variables,
            abstract,
            self.precision.initial_scale(),
        )
        if abstract:
            return self.placement.abstract(state, replicated=True)
        self.state = self.placement.replicate(state)
        return self.state

    def _require_state(self) -> TrainState:
        if self.state is None:
            raise RuntimeError("the model has no parameters yet: call fit (or evaluate) first")
        return self.state
