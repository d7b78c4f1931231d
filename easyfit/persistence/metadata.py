"""What a checkpoint records beside the state, as JSON, and whether a saved optimizer fits.

``Trainer.save`` and ``BackupAndRestore`` write :func:`checkpoint_meta`'s dict into the
checkpoint's ``metadata`` item (``easyfit.persistence.checkpoint``); ``Trainer.load`` reads it
back and asks :func:`optimizer_mismatch` whether the saved optimizer state can be restored into
the trainer's. The functions take plain values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import CheckpointError

__all__ = ["checkpoint_meta", "optimizer_meta", "optimizer_mismatch"]


def checkpoint_meta(
    *,
    seed: int,
    input_spec: tuple[Any, Any] | None,
    input_scale: float | None,
    class_names: Sequence[str] | None,
    precision: str,
    data: Mapping[str, Any] | None,
    optimizer: Mapping[str, Any],
    recipe: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The metadata of a trainer's checkpoint: the seed, one sample's input shape and dtype
    (``input_spec``), the input scale, the class names, the precision's name, the training
    data's fingerprint (``data``: a fit with a backup), the optimizer (:func:`optimizer_meta`)
    and the training data's input recipe (``easyfit.data.recipe``)."""
    shape, dtype = input_spec or (None, None)
    return {
        "seed": seed,
        "input_shape": shape,
        "input_dtype": dtype,
        "input_scale": input_scale,
        "class_names": None if class_names is None else list(class_names),
        "precision": precision,
        "data": None if data is None else dict(data),
        "optimizer": dict(optimizer),
        "recipe": recipe,
    }


def optimizer_meta(name: str | None, opt_state: Any) -> dict[str, Any]:
    """The optimizer as a checkpoint records it: its Keras name when it was given by name, and
    the layout of its state (what must match to restore it; None before there is a state)."""
    return {"name": name, "state": None if opt_state is None else _layout(opt_state)}


def optimizer_mismatch(
    where: str, meta: Mapping[str, Any], mine: Mapping[str, Any], given: bool
) -> str | None:
    """None when the checkpoint's optimizer state (``meta["optimizer"]``) can be restored into
    one of the layout ``mine`` (:func:`optimizer_meta`), or is not there to restore; else, when
    no optimizer was ``given`` to the trainer, why not (the weights then load for inference,
    and ``fit`` says it).

    Raises:
        CheckpointError: the layouts differ and an optimizer was given, naming both.
    """
    saved = meta.get("optimizer")
    if meta["kind"] != "full" or not saved:  # older checkpoints do not say: restore as before
        return None
    if saved.get("state") == mine["state"]:
        return None

    def name(o: Mapping[str, Any]) -> str:
        return f"{o['name']!r} (state {o['state']})" if o.get("name") else f"state {o['state']}"

    if given:
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
