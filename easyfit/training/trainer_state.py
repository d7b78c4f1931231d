"""The trainer's state and what keeps it: parameters, checkpoints, summary and export.

:class:`TrainerState` is the part of :class:`easyfit.Trainer` (a base class, as Keras' ``Model``
takes its training methods from a ``Trainer`` base) that creates ``trainer.state`` and saves,
loads, summarises and exports it. The training loops are in ``easyfit/training/trainer.py``.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
from flax import nnx

from ..data.recipe import ImageRecipe
from ..errors import CheckpointError
from ..persistence import checkpoint
from ..persistence import export as export_lib
from . import steps
from .models import write_back
from .state import TrainState, create_state, inference_params

if TYPE_CHECKING:
    import optax

    from ..data.inputs import DataInputs
    from ..parallel import Placement
    from .models import ModelAdapter
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
    _data_fingerprint: dict[str, Any] | None  # the last fit's training data (with a backup)
    _optimizer_name: str | None  # the Keras name it was given by, if any
    _optimizer_given: bool
    _inference_only: str | None  # why fit cannot go on (loaded without the optimizer)
    _adapter: ModelAdapter
    _model: Any
    _nnx_variables: Any
    _data: DataInputs
    optimizer: optax.GradientTransformation
    placement: Placement
    precision: Precision
    ema_momentum: float | None

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
            return nnx.merge(
                self._adapter.module, *jax.device_get((inference_params(self.state), self.state.model_state))
            )
        return self._model

    @property
    def progress(self) -> checkpoint.Progress | None:
        """Where the current (or last) fit stands: epoch, batch, loader position."""
        return self._progress

    @property
    def checkpoint_meta(self) -> dict[str, Any]:
        """What a checkpoint records beside the state and the progress: the seed, the input
        shape and dtype, the class names, the optimizer, the training data's input recipe
        (``easyfit.data.recipe``) and its fingerprint (a fit with a backup)."""
        shape, dtype = self._input_spec or (None, None)
        return {
            "seed": self.seed,
            "input_shape": shape,
            "input_dtype": dtype,
            "input_scale": self._input_scale,
            "class_names": self.class_names,
            "precision": self.precision.name,
            "data": self._data_fingerprint,
            "optimizer": self._optimizer_meta(self.state.opt_state if self.state is not None else None),
            "recipe": self._data.recipe,
        }

    def _optimizer_meta(self, opt_state: Any) -> dict[str, Any]:
        """The optimizer as a checkpoint records it: its Keras name when given by name, and
        the layout of its state (what must match to restore it)."""
        return {"name": self._optimizer_name, "state": None if opt_state is None else _layout(opt_state)}

    def _check_trainable(self) -> None:
        """Raises ValueError when the state was loaded for inference, without its optimizer."""
        if self._inference_only is not None:
            raise ValueError(f"fit: {self._inference_only}")

    def summary(self, print_fn: Any = None) -> None:
        """Prints the parameter table per module and the totals: trainable, non-trainable
        (BatchNorm statistics) and bytes. Returns None, as Keras' ``Model.summary``.

        Args:
            print_fn: called once with the whole text (None: ``print``); e.g.
                ``lines.append`` to keep it.
        """
        state = self._require_state()
        export_lib.summary(state.params, state.model_state, type(self._model).__name__, print_fn or print)

    def export(self, path: str | os.PathLike, *, inputs: str = "images") -> str:
        """Writes the inference function with the trained weights as serialized StableHLO and
        ``model.json`` (class names, input recipe): it runs with JAX alone, for any batch size
        (``easyfit.persistence.export``).

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
        if inputs not in ("images", "prepared"):
            raise ValueError(f"inputs={inputs!r}: expected 'images' or 'prepared'")
        infer = functools.partial(
            steps.make_infer(self._adapter, self._input_scale, self.precision),
            jax.device_get(self._require_state()),
        )
        shape, dtype = self._input_spec or ([], None)
        recipe = self._data.recipe or {}
        images = ImageRecipe.from_json(recipe["images"]) if recipe.get("images") else None
        if inputs == "prepared" or images is None or shape != list(images.shape):
            return export_lib.export(path, infer, shape, dtype, self.class_names, recipe=recipe or None)
        return export_lib.export(
            path,
            export_lib.from_images(infer, images.normalize),
            list(images.shape),
            "uint8",
            self.class_names,
            recipe={**recipe, "preprocessing": images.steps()},
        )

    # ---------------------------------------------------------------------------- checkpoints
    def save(self, path: str | os.PathLike, *, weights_only: bool = False) -> str:
        """Writes an Orbax checkpoint: parameters, optimizer state, step, RNG key, the epoch
        reached, the seed, and the training data's input recipe as plain JSON, so that ``load``
        reads data as training did (see ``easyfit.persistence.checkpoint``). Replaces a checkpoint already
        at ``path`` only once the new one is complete.

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

        The trainer must have the same model, and to go on training the same optimizer. A full
        checkpoint also restores the seed, the class names and the epoch: go on with
        ``fit(..., initial_epoch=meta["epoch"])``. The training data's input recipe comes back
        too: paths and arrays are then read as in training (``easyfit.data.recipe``); a
        checkpoint without one (an older easyfit's) warns and leaves the trainer's reading as
        it was. Saved with another optimizer than this trainer's: when none was given to the
        trainer, the parameters, model state and step load for inference (``fit`` then says
        which optimizer to pass); when one was, CheckpointError naming both.

        Returns:
            The checkpoint's metadata (``epoch``, ``step``, ``seed``, ...).

        Raises:
            CheckpointError: ``path`` is not a complete easyfit checkpoint, or cannot be
                restored into this trainer.
        """
        meta = checkpoint.read_metadata(path)
        where = os.path.abspath(os.fspath(path))
        if self.state is None and meta["input_shape"] is None and self._adapter.kind != "nnx":
            raise CheckpointError(f"{where}: no input shape recorded; call fit or evaluate first")
        shape, dtype = meta["input_shape"] or [], meta["input_dtype"]
        abstract = self._init_state(shape, dtype, abstract=True) if self.state is None else self.state
        why = self._optimizer_mismatch(where, meta, abstract.opt_state)
        target = self.state
        if target is None:  # a full checkpoint needs only the shapes; weights need a whole state
            whole = meta["kind"] == "weights" or why is not None
            target = abstract if not whole else self._init_state(shape, dtype)
        self.state, _ = checkpoint.restore(
            checkpoint.reader(path), target, meta, weights_only=why is not None
        )
        self._inference_only = why
        recipe = meta.get("recipe")
        if recipe is None:
            warnings.warn(
                f"{where}: the checkpoint carries no input recipe (saved by an older easyfit, "
                "or before the trainer saw data): data is read as without it (the sources' "
                "defaults); give sources the settings of training (image_size=, normalize=, ...)",
                stacklevel=2,
            )
        else:
            self._data.use_recipe(recipe)
        if meta["class_names"] is not None:
            self.class_names = list(meta["class_names"])
        self._input_scale = meta.get("input_scale")
        if meta["kind"] == "full":
            self.seed = int(meta["seed"])
            self._data.seed = self.seed
            self._progress = checkpoint.Progress(meta["epoch"])
        write_back(self._model, self.state)
        return meta

    def _optimizer_mismatch(self, where: str, meta: dict[str, Any], opt_state: Any) -> str | None:
        """None when the checkpoint's optimizer state can be restored into this trainer's (or
        is not there to restore); else why not, for ``fit`` to say, when no optimizer was
        given (the weights then load for inference). CheckpointError naming both optimizers
        when one was given."""
        saved = meta.get("optimizer")
        if meta["kind"] != "full" or not saved:  # older checkpoints do not say: restore as before
            return None
        mine = self._optimizer_meta(opt_state)
        if saved.get("state") == mine["state"]:
            return None

        def name(o: dict[str, Any]) -> str:
            return f"{o['name']!r} (state {o['state']})" if o.get("name") else f"state {o['state']}"

        if self._optimizer_given:
            raise CheckpointError(
                f"{where}: saved with the optimizer {name(saved)}, but this trainer's optimizer "
                f"is {name(mine)}; pass the optimizer it was trained with to go on training"
                + (f" (optimizer={saved['name']!r})" if saved.get("name") else "")
                + ", or leave optimizer= out to load the weights for inference"
            )
        return (
            f"the weights were loaded from {where} for inference only: it was saved with the "
            f"optimizer {name(saved)}, and none was given; to go on training, pass it: "
            f"Trainer.from_checkpoint(path, model, optimizer="
            + (repr(saved["name"]) if saved.get("name") else "<the optax optimizer of training>")
            + ")"
        )

    def _init_state(self, shape: Any, dtype: Any, abstract: bool = False) -> Any:
        """Creates ``self.state`` for inputs of ``shape`` (one sample's, or a dict or list of
        them: ``easyfit.training.models.input_spec``); with ``abstract``, returns its shapes, dtypes and
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
            ema=self.ema_momentum is not None,
        )
        if abstract:
            return self.placement.abstract(state, replicated=True)
        self.state = self.placement.replicate(state)
        return self.state

    def _require_state(self) -> TrainState:
        if self.state is None:
            raise RuntimeError("the model has no parameters yet: call fit (or evaluate) first")
        return self.state


def _layout(tree: Any) -> str:
    """The layout of an optimizer state: its state classes with their nested states, and the
    names of hyperparameters (``inject_hyperparams``), e.g.
    ``InjectStatefulHyperparamsState(hyperparams={learning_rate},
    inner_state=(ScaleByAdamState, EmptyState))``."""
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # optax's NamedTuple states
        inner = [
            f"{f}={_layout(v)}"
            for f, v in zip(tree._fields, tree, strict=True)
            if isinstance(v, (tuple, list)) or (f == "hyperparams" and isinstance(v, Mapping))
        ]  # not the trees shaped as the parameters (mu, nu, trace)
        return type(tree).__name__ + (f"({', '.join(inner)})" if inner else "")
    if isinstance(tree, (tuple, list)):
        return "(" + ", ".join(_layout(t) for t in tree) + ")"
    if isinstance(tree, Mapping):
        return "{" + ", ".join(sorted(map(str, tree))) + "}"
    return type(tree).__name__
