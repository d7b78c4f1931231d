"""A trained model's parameter table, and its inference function exported with ``jax.export``.

:func:`summary` lists every parameter array with its shape and size (clu's
``parameter_overview``), then the totals: trainable parameters, non-trainable variables (such as
BatchNorm statistics) and bytes. :func:`export` writes the inference function as serialized
StableHLO with the trained weights inside, and the class names beside it: it loads and runs with
JAX alone (:func:`load_exported`, or the three lines shown in its docstring), without easyfit
and without the model's Python class, for any batch size.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._files import write_files
from ..data.recipe import ImageRecipe

__all__ = ["export", "export_trained", "load_exported", "summary"]

FUNCTION = "model.stablehlo"
META = "model.json"


def _pure(tree: Any) -> Any:
    """A plain nested dict of arrays (NNX states included)."""
    to_pure = getattr(tree, "to_pure_dict", None)
    return to_pure() if callable(to_pure) else tree


def _host(a: Any) -> Any:
    """``a`` as a NumPy array; a typed PRNG key (NNX ``Rngs`` and ``Dropout`` state) as its key
    data, which NumPy can hold (a ``key<fry>`` of shape ``()`` shows as ``uint32`` ``(2,)``)."""
    if jax.dtypes.issubdtype(getattr(a, "dtype", None), jax.dtypes.prng_key):
        a = jax.random.key_data(a)
    return np.asarray(a)


def _count(tree: Any) -> tuple[int, int]:
    leaves = [_host(a) for a in jax.tree_util.tree_leaves(tree) if hasattr(a, "shape")]
    return sum(int(a.size) for a in leaves), sum(int(a.nbytes) for a in leaves)


def summary(
    params: Any, model_state: Any, name: str = "model", print_fn: Callable[[str], Any] | None = None
) -> str:
    """The parameter table of ``params`` and the totals, printed with ``print_fn`` if given
    (``Trainer.summary``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from easyfit.persistence.export import summary
        >>> params = {"Dense_0": {"kernel": jnp.zeros((784, 10)), "bias": jnp.zeros(10)}}
        >>> for line in summary(params, {}).splitlines()[-3:]:
        ...     print(line)
        Trainable parameters: 7,850 (30.7 KiB)
        Non-trainable variables: 0 (0 B)
        Total: 7,850 (30.7 KiB)
    """
    params = jax.device_get(_pure(params))
    state = jax.device_get(_pure(model_state))
    table = jax.tree_util.tree_map(_host, params)
    lines = [f"{name}: parameters", parameter_overview(table)]
    if jax.tree_util.tree_leaves(state):
        lines += ["Non-trainable variables", parameter_overview(jax.tree_util.tree_map(_host, state))]
    n, b = _count(params)
    m, c = _count(state)
    lines += [
        f"Trainable parameters: {n:,} ({_size(b)})",
        f"Non-trainable variables: {m:,} ({_size(c)})",
        f"Total: {n + m:,} ({_size(b + c)})",
    ]
    text = "\n".join(lines)
    if print_fn is not None:
        print_fn(text)
    return text


def _size(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that keeps it at least 1: ``30.7 KiB``."""
    size, unit = float(nbytes), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{nbytes} B" if unit == "B" else f"{size:,.1f} {unit}"


def parameter_overview(tree: Mapping[str, Any]) -> str:
    """clu's table of ``tree``'s arrays: name, shape, size, mean and std (without clu's own
    total under it: the summary ends with one set of totals)."""
    from clu import parameter_overview as overview

    text = overview.get_parameter_overview(dict(tree), include_stats=True)
    return "\n".join(line for line in text.splitlines() if not line.startswith("Total:"))


def _specs(shape: Any, dtype: Any, batch: Any) -> Any:
    """``jax.ShapeDtypeStruct`` of a batch of inputs of one sample's ``shape`` and ``dtype``
    (dicts or lists of them for several inputs, as ``easyfit.core.models.input_spec`` gives)."""
    if isinstance(shape, Mapping):
        return {
            k: _specs(v, dtype[k] if isinstance(dtype, Mapping) else dtype, batch) for k, v in shape.items()
        }
    if not all(isinstance(d, int) for d in shape):  # a list of shapes: a tuple of inputs
        return tuple(
            _specs(v, dtype[i] if isinstance(dtype, list) else dtype, batch) for i, v in enumerate(shape)
        )
    return jax.ShapeDtypeStruct((*batch, *map(int, shape)), jnp.dtype(dtype or "float32"))


def export(
    path: str | os.PathLike,
    apply: Callable[[Any], Any],
    sample_shape: Any,
    dtype: Any,
    class_names: Sequence[str] | None = None,
    recipe: Mapping[str, Any] | None = None,
) -> str:
    """Writes ``apply`` (a function of a batch only, the weights closed over) to ``path``: the
    serialized StableHLO (``model.stablehlo``) for a symbolic batch size, and ``model.json``
    (input shape and dtype, class names, and the training data's input ``recipe`` when
    given). ``sample_shape`` and ``dtype``: one sample's (dicts or lists of them for a model
    of several inputs, which then takes a dict or a tuple).

    Both files are written whole to staging names, then renamed over the old ones: an export
    that fails (a full disk) leaves the previous export at ``path`` as it was, and loadable.

    Returns:
        ``path``.
    """
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    spec = _specs(sample_shape, dtype, jax.export.symbolic_shape("batch"))
    exported = jax.export.export(jax.jit(apply))(spec)
    meta = {
        "input_shape": jax.tree_util.tree_map(lambda s: [None, *map(int, s.shape[1:])], spec),
        "input_dtype": jax.tree_util.tree_map(lambda s: str(s.dtype), spec),
        "class_names": list(class_names) if class_names is not None else None,
        "format": "jax.export (StableHLO), weights inside; call with a batch of inputs",
        "recipe": None if recipe is None else dict(recipe),
    }
    write_files(
        {
            os.path.join(path, FUNCTION): bytes(exported.serialize()),
            os.path.join(path, META): json.dumps(meta, indent=1).encode(),
        }
    )
    return path


def from_images(
    infer: Callable[[Any], Any], normalize: tuple[Sequence[float], Sequence[float]] | None
) -> Callable[[Any], Any]:
    """``infer`` (a function of the inputs the train step sees) as a function of uint8 images:
    normalised as the input pipeline does (``(x / 255 - mean) / std``, rounded to float16 as it
    delivers them), or passed on as uint8 (the step's own scale then applies)."""
    if normalize is None:
        return infer
    mean = jnp.asarray([255 * m for m in normalize[0]], jnp.float32)
    inv_std = 1 / jnp.asarray([255 * s for s in normalize[1]], jnp.float32)

    def apply(images: Any) -> Any:
        return infer(((images.astype(jnp.float32) - mean) * inv_std).astype(jnp.float16))

    return apply


def export_trained(
    path: str | os.PathLike,
    infer: Callable[[Any], Any],
    input_spec: tuple[Any, Any],
    class_names: Sequence[str] | None,
    recipe: Mapping[str, Any] | None,
    inputs: str = "images",
) -> str:
    """Writes a trained model's inference function (``Trainer.export``): ``infer`` takes inputs
    as the train step sees them; ``input_spec`` is one sample's ``(shape, dtype)`` of them and
    ``recipe`` the training data's input recipe (``easyfit.data.recipe``).

    With ``inputs="images"``, for a model trained on images of the recipe's size, the function
    written takes uint8 NHWC images and applies the normalisation inside (:func:`from_images`),
    and ``model.json``'s ``recipe`` gains ``preprocessing``: what a server must still do. Else
    (``"prepared"``, or other data) it takes the train step's inputs.

    Returns:
        ``path``.
    """
    if inputs not in ("images", "prepared"):
        raise ValueError(f"inputs={inputs!r}: expected 'images' or 'prepared'")
    shape, dtype = input_spec
    recipe = dict(recipe or {})
    images = ImageRecipe.from_json(recipe["images"]) if recipe.get("images") else None
    if inputs == "prepared" or images is None or shape != list(images.shape):
        return export(path, infer, shape, dtype, class_names, recipe=recipe or None)
    return export(
        path,
        from_images(infer, images.normalize),
        list(images.shape),
        "uint8",
        class_names,
        recipe={**recipe, "preprocessing": images.steps()},
    )


def load_exported(path: str | os.PathLike) -> tuple[Callable[[Any], jax.Array], dict[str, Any]]:
    """``(function, metadata)`` of a model written by :func:`export` (``Trainer.export``).

    Without easyfit, the same in plain JAX::

        import jax, json
        fn = jax.export.deserialize(open("exported/model.stablehlo", "rb").read()).call
        class_names = json.load(open("exported/model.json"))["class_names"]
    """
    path = os.fspath(path)
    with open(os.path.join(path, FUNCTION), "rb") as f:
        exported = jax.export.deserialize(bytearray(f.read()))
    with open(os.path.join(path, META)) as f:
        meta = json.load(f)
    return exported.call, meta
