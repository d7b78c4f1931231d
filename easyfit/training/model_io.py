"""The trained model in and out of files: ``Trainer.save``, ``load``, ``from_checkpoint``,
``export`` and ``summary`` call these functions with the trainer.

The files are written and read by the layers below (``easyfit.persistence``: Orbax
checkpoints, the export, the layer table; ``easyfit.models.adapters``: LoRA adapters on their
own); this module decides what of the trainer goes into them and what comes back into it.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import jax
import jax.numpy as jnp

from .._interrupts import shielded
from ..core import steps
from ..core.models import write_back
from ..errors import CheckpointError
from ..persistence import checkpoint, metadata
from ..persistence import export as export_lib
from .args import check_int

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["export", "from_checkpoint", "load", "save", "summary"]

T = TypeVar("T", bound="Trainer")


def from_checkpoint(cls: type[T], path: str | os.PathLike, model: Any, **kwargs: Any) -> T:
    """A trainer of class ``cls`` for ``model`` (built with ``kwargs``) holding the checkpoint
    (or adapters) at ``path``."""
    trainer = cls(model, **kwargs)
    trainer.load(path)
    return trainer


def summary(
    trainer: Trainer,
    input_shape: Any,
    input_dtype: Any,
    print_fn: Callable[[str], Any] | None,
    line_length: int | None,
) -> None:
    """Prints the layer table and totals of the trainer's model (``Trainer.summary``)."""
    spec = trainer._input_spec
    if input_shape is None and spec is not None and spec[1] is not None:
        input_shape = spec[0]
    if input_shape is None:
        raise RuntimeError(
            "summary: the model's input shape is not known yet: pass one sample's shape "
            "(trainer.summary(input_shape=(28, 28, 1))), or call fit first"
        )
    x = export_lib.summary_input(input_shape, input_dtype)
    check_int("line_length", line_length, 20, none=True)
    state, adapter, layout = trainer.state, trainer._adapter, trainer._layout
    if state is not None:
        variables = (state.params, state.model_state)
    elif adapter.kind == "nnx":
        variables = trainer._nnx_variables
    else:  # shapes only: the model traced on abstract inputs
        variables = jax.eval_shape(adapter.init, jax.random.key(trainer.seed), x)
    table = export_lib.layer_table(adapter, variables, x, line_length)
    placed = None if state is None or not layout.sharded else layout.parts(state)
    where = None if placed is None else export_lib.sharding_table(layout.describe(), placed)
    export_lib.summary(
        *variables, type(trainer._model).__name__, print_fn or print, layers=table, sharding=where
    )


def export(trainer: Trainer, path: str | os.PathLike, inputs: str) -> str:
    """Writes the trained inference function and ``model.json`` (``Trainer.export``)."""
    if inputs not in ("images", "prepared"):
        raise ValueError(f"inputs={inputs!r}: expected 'images' or 'prepared'")
    # on the host, as JAX arrays: NumPy's are read-only, and an NNX module drawing from the
    # nnx.Rngs it holds writes its count while the export traces it
    host = jax.tree_util.tree_map(jnp.asarray, jax.device_get(trainer._require_state()))
    scale = trainer._hook_values.input_scale
    adapter = trainer._adapter
    if adapter.kind == "nnx":  # LoRA adapters folded into their kernels: plain weights
        from ..models.adapters import merged_for_inference

        adapter, host = merged_for_inference(adapter, host)
    infer = functools.partial(steps.make_infer(adapter, scale, trainer.precision), host)
    spec = trainer._input_spec or ([], None)
    return export_lib.export_trained(path, infer, spec, trainer.class_names, trainer._data.recipe, inputs)


def save(trainer: Trainer, path: str | os.PathLike, weights_only: bool, adapters_only: bool) -> str:
    """Writes a checkpoint, or the LoRA adapters alone (``Trainer.save``)."""
    with shielded("the save in progress"):  # a Ctrl-C meanwhile is raised once the checkpoint is whole
        if adapters_only:
            return _save_adapters(trainer, path)
        return checkpoint.save(
            path,
            trainer._require_state(),
            trainer._progress,
            trainer.checkpoint_meta,
            weights_only=weights_only,
        )


def load(trainer: Trainer, path: str | os.PathLike) -> dict[str, Any]:
    """Restores a checkpoint (or adapters) into the trainer (``Trainer.load``); returns its
    metadata."""
    if os.path.isfile(os.path.join(os.fspath(path), "adapter_config.json")):  # flax.nnx only then
        from ..models.adapters import is_adapters

        if is_adapters(path):
            return _load_adapters(trainer, path)
    meta = checkpoint.read_metadata(path)
    where = os.path.abspath(os.fspath(path))
    adapter = trainer._adapter
    if trainer.state is None and meta["input_shape"] is None and adapter.kind != "nnx":
        raise CheckpointError(f"{where}: no input shape recorded; call fit or evaluate first")
    shape, dtype = meta["input_shape"] or [], meta["input_dtype"]
    state = trainer.state
    abstract = trainer._init_state(shape, dtype, abstract=True) if state is None else state
    mine = trainer._optimizer_meta(abstract.opt_state)
    why = metadata.optimizer_mismatch(where, meta, mine, trainer._optimizer_given)
    target = state
    if target is None:  # a full checkpoint needs only the shapes; weights need a whole state
        whole = meta["kind"] == "weights" or why is not None
        target = abstract if not whole else trainer._init_state(shape, dtype)
    trainer.state, _ = checkpoint.restore(checkpoint.reader(path), target, meta, weights_only=why is not None)
    trainer._inference_only = why
    _use_recipe(trainer, where, meta.get("recipe"))
    names = meta["class_names"]
    trainer._know(meta.get("input_scale"), trainer.class_names if names is None else list(names))
    if meta["kind"] == "full":
        trainer.seed = int(meta["seed"])
        trainer._data.seed = trainer.seed
        trainer._progress = checkpoint.Progress(meta["epoch"])
    write_back(trainer._model, trainer.state)
    return meta


def _use_recipe(trainer: Trainer, where: str, recipe: dict[str, Any] | None, stacklevel: int = 4) -> None:
    """The saved input recipe becomes the trainer's reading of paths and arrays; without one,
    a warning that says data is read as without it."""
    if recipe is None:
        warnings.warn(
            f"{where}: the checkpoint carries no input recipe (saved by an older easyfit, "
            "or before the trainer saw data): data is read as without it (the sources' "
            "defaults); give sources the settings of training (image_size=, normalize=, ...)",
            stacklevel=stacklevel,  # the caller of Trainer.load
        )
    else:
        trainer._data.use_recipe(recipe)


def _save_adapters(trainer: Trainer, path: str | os.PathLike) -> str:
    """The LoRA adapters and the head alone, with the input recipe and what ``load`` restores
    besides the weights (``models.adapters.save_adapters``)."""
    from ..models.adapters import optimizer_arrays, save_adapters

    state = trainer._require_state()
    if trainer._adapter.kind != "nnx":
        raise ValueError(
            f"save(adapters_only=True): {type(trainer._model).__name__} is a linen module; LoRA "
            "adapters are added to NNX models (ef.models.trainable(model, tx, 'lora:rank=N'))"
        )
    write_back(trainer._model, state)
    meta = trainer.checkpoint_meta
    progress = trainer._progress or checkpoint.Progress(0)
    restored = {
        "epoch": progress.epoch,
        "step": int(jax.device_get(state.step)),
        **{k: meta.get(k) for k in ("seed", "input_shape", "input_dtype", "input_scale")},
    }
    return save_adapters(
        trainer._model,
        path,
        recipe=trainer._data.recipe,
        class_names=trainer.class_names,
        checkpoint=restored,
        optimizer=optimizer_arrays(state.opt_state),
    )


def _load_adapters(trainer: Trainer, path: str | os.PathLike) -> dict[str, Any]:
    """Puts the LoRA adapters (and head) saved at ``path`` onto the trainer's model, whose base
    weights stay; CheckpointError naming ``path`` when the model has no LoRA layers or another
    base (``models.adapters.load_adapters`` says what differs)."""
    from flax import nnx

    from ..models.adapters import has_adapters, load_adapters, restore_optimizer

    where = os.path.abspath(os.fspath(path))
    adapter, state = trainer._adapter, trainer.state
    variables = trainer._nnx_variables if state is None else (state.params, state.model_state)
    if adapter.kind != "nnx" or not has_adapters(variables[0]):
        raise CheckpointError(
            f"{where}: holds LoRA adapters, but the trainer's model ({type(trainer._model).__name__}) "
            "has no LoRA layers; build it from the base weights with the adapters' rank first: "
            "Trainer(model, optimizer=ef.models.trainable(model, tx, 'lora:rank=N'))"
        )
    host = jax.tree_util.tree_map(jnp.asarray, jax.device_get(variables))  # writable, unlike NumPy's
    model = nnx.merge(adapter.module, *host, copy=True)
    try:
        config = load_adapters(model, where)
    except ValueError as e:  # another base, rank or head: named, nothing changed
        raise CheckpointError(f"{where}: {e}") from e
    _, params, rest = cast("tuple[nnx.GraphDef, nnx.State, nnx.State]", nnx.split(model, nnx.Param, ...))
    saved = config.get("checkpoint") or {}
    if state is None:
        state = trainer._init_state(saved.get("input_shape") or [], saved.get("input_dtype"))
    put = functools.partial(jax.tree_util.tree_map, lambda new, old: jax.device_put(new, old.sharding))
    params, rest = put(params, state.params), put(rest, state.model_state)
    ema = None if state.ema_params is None else jax.tree_util.tree_map(jnp.copy, params)  # starts there
    state = state.replace(params=params, model_state=rest, ema_params=ema)
    if config.get("optimizer"):  # the optimizer state, for a resumed fine-tune, and its step
        from safetensors.numpy import load_file

        file = os.path.join(where, config["optimizer"])
        if not os.path.isfile(file):
            raise CheckpointError(f"{where}: {config['optimizer']} is missing (the config names it)")
        opt_state, why = restore_optimizer(state.opt_state, load_file(file))
        if why is None:
            state = state.replace(opt_state=opt_state)
            if saved.get("step") is not None:
                step = jnp.asarray(saved["step"], state.step.dtype)
                state = state.replace(step=jax.device_put(step, state.step.sharding))
        else:
            warnings.warn(
                f"{where}: the optimizer state saved with the adapters is {why}, not this "
                "trainer's: the adapters loaded, the trainer keeps its own optimizer state "
                "(fresh before any fit)",
                stacklevel=4,
            )
    trainer.state = state
    _use_recipe(trainer, where, config.get("recipe"), stacklevel=5)
    names = config.get("class_names")
    trainer._know(saved.get("input_scale"), trainer.class_names if names is None else list(names))
    pre = getattr(model, "preprocessing", None)
    if pre is not None and config.get("preprocessing"):  # the weights' recipe, as load_adapters sets it
        trainer._model.preprocessing = pre
    write_back(trainer._model, trainer.state)
    return {**saved, **config, "kind": "adapters"}
