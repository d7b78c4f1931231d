"""A model's summary, and its inference function exported with ``jax.export``.

:func:`summary` shows the model's layers in the order it calls them, with their output shapes
and parameters (:func:`layer_table`: Flax's ``tabulate``), then the totals: trainable
parameters, non-trainable variables (such as BatchNorm statistics) and bytes. :func:`export`
writes the inference function as serialized StableHLO with the trained weights inside, and the
class names beside it: it loads and runs with JAX alone (:func:`load_exported`, or the three
lines shown in its docstring), without easyfit and without the model's Python class, for any
batch size.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._files import write_files
from ..core.models import ModelAdapter
from ..data.recipe import ImageRecipe

__all__ = [
    "export",
    "export_trained",
    "layer_table",
    "load_exported",
    "sharding_table",
    "summary",
    "summary_input",
]

FUNCTION = "model.stablehlo"
META = "model.json"
_WIDE = 1000  # a console width no table reaches: each column as wide as its cells


def _pure(tree: Any) -> Any:
    """A plain nested dict of arrays (NNX states included)."""
    to_pure = getattr(tree, "to_pure_dict", None)
    return to_pure() if callable(to_pure) else tree


def _count(tree: Any) -> tuple[int, int]:
    """Elements and bytes of ``tree``'s arrays, from their shapes and dtypes (abstract leaves
    too: a model summarised before fit); a typed PRNG key counts as its key data."""

    def data(a: Any) -> Any:
        return jax.random.key_data(a) if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) else a

    arrays = [a for a in jax.tree_util.tree_leaves(tree) if hasattr(a, "shape") and hasattr(a, "dtype")]
    leaves = jax.tree_util.tree_leaves(jax.eval_shape(lambda t: [data(a) for a in t], arrays))
    sizes = [(int(np.prod(a.shape)), np.dtype(a.dtype).itemsize) for a in leaves]
    return sum(n for n, _ in sizes), sum(n * b for n, b in sizes)


def summary(
    params: Any,
    model_state: Any,
    name: str = "model",
    print_fn: Callable[[str], Any] | None = None,
    layers: str | None = None,
    sharding: str | None = None,
) -> str:
    """The layer table ``layers`` (:func:`layer_table`; without it, ``name``), then the totals
    of ``params`` and ``model_state`` (arrays or ``jax.ShapeDtypeStruct``), then ``sharding``
    (:func:`sharding_table`) when given, printed with ``print_fn`` if given
    (``Trainer.summary``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from easyfit.persistence.export import summary
        >>> params = {"Dense_0": {"kernel": jnp.zeros((784, 10)), "bias": jnp.zeros(10)}}
        >>> print(summary(params, {}))
        Model: model
        Trainable parameters: 7,850 (30.7 KiB)
        Non-trainable variables: 0 (0 B)
        Total: 7,850 (30.7 KiB)
    """
    n, b = _count(_pure(params))
    m, c = _count(_pure(model_state))
    lines = [layers if layers is not None else f"Model: {name}"]
    lines += [
        f"Trainable parameters: {n:,} ({_size(b)})",
        f"Non-trainable variables: {m:,} ({_size(c)})",
        f"Total: {n + m:,} ({_size(b + c)})",
    ]
    if sharding is not None:
        lines.append(sharding)
    text = "\n".join(lines)
    if print_fn is not None:
        print_fn(text)
    return text


def sharding_table(name: str, parts: Mapping[str, Any], listed: Sequence[str] = ("params",)) -> str:
    """The state's layout on the devices, read from its arrays' shardings: a line per array of
    the ``listed`` parts (its path, shape, ``PartitionSpec`` and bytes on one device), then per
    part the bytes one device holds of the whole.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from easyfit.persistence.export import sharding_table
        >>> print(sharding_table("fsdp", {"params": {"w": jnp.zeros((4, 8))}}))
        Sharding: fsdp
          params/w  (4, 8)  P()  128 B per device
        params: 128 B per device, of 128 B
    """
    lines = [f"Sharding: {name}"]
    rows, totals = [], []
    for part, tree in parts.items():
        held = whole = 0
        for keys, a in jax.tree_util.tree_leaves_with_path(_pure(tree)):
            if not hasattr(a, "addressable_shards"):
                continue
            mine = a.addressable_shards[0].data.nbytes
            held, whole = held + mine, whole + a.nbytes
            if part in listed:
                path = "/".join(
                    str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in keys
                )
                rows.append(
                    (
                        f"{part}/{path}",
                        str(tuple(a.shape)),
                        str(getattr(a.sharding, "spec", "P()")),
                        f"{_size(mine)} per device",
                    )
                )
        if whole:
            totals.append(f"{part}: {_size(held)} per device, of {_size(whole)}")
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(4)]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines + totals)


def summary_input(shape: Any, dtype: Any = None, what: str = "input_shape") -> Any:
    """A batch of one zero sample of ``shape`` (one sample's: a tuple of ints, or a dict or a
    tuple of them for a model of several inputs, which then takes a dict or a tuple), in
    ``dtype`` (float32 by default, which the model is given in training whatever the data's
    dtype; a dict or a tuple of dtypes for several inputs).

    Raises:
        ValueError: ``shape`` or ``dtype`` is not one of those, naming ``what``.

    Example:
        >>> from easyfit.persistence.export import summary_input
        >>> summary_input((28, 28, 1)).shape
        (1, 28, 28, 1)
        >>> {k: v.dtype.name for k, v in summary_input({"a": (4,), "b": ()}, {"b": "int32"}).items()}
        {'a': 'float32', 'b': 'int32'}
    """

    def pick(key: Any) -> Any:
        if isinstance(dtype, Mapping):
            return dtype.get(key)
        return dtype[key] if isinstance(dtype, (list, tuple)) else dtype

    if isinstance(shape, Mapping):
        return {k: summary_input(v, pick(k), f"{what}[{k!r}]") for k, v in shape.items()}
    if isinstance(shape, (list, tuple)) and all(isinstance(d, (int, np.integer)) for d in shape):
        if any(int(d) < 0 for d in shape):
            raise ValueError(f"{what}={shape!r}: a sample's shape has no negative sizes")
        try:
            dtype = jnp.dtype(dtype if dtype is not None else "float32")
        except TypeError as e:
            raise ValueError(f"input_dtype for {what}: {dtype!r} is not a dtype") from e
        return jnp.zeros((1, *map(int, shape)), dtype)
    several = isinstance(shape, (list, tuple)) and shape
    if several and all(isinstance(v, (list, tuple, Mapping)) for v in shape):
        return tuple(summary_input(v, pick(i), f"{what}[{i}]") for i, v in enumerate(shape))
    raise ValueError(
        f"{what}={shape!r}: expected one sample's shape without the batch axis, a tuple of ints "
        "such as (28, 28, 1), or a dict or a tuple of such shapes for a model of several inputs"
    )


@contextlib.contextmanager
def _methods_kept(model: Any) -> Iterator[None]:
    """Puts back the methods of ``model``'s classes as they were: ``nnx.tabulate`` replaces them
    while it runs and restores them only when the model runs through, so that a model failing
    on the inputs (a wrong ``input_shape``) would keep the replacements, for every later call."""
    from flax import nnx

    saved = {t: dict(vars(t)) for t in {type(node) for _, node in nnx.iter_graph(model)}}
    try:
        yield
    finally:
        for cls, before in saved.items():
            for name in set(vars(cls)) - set(before):
                delattr(cls, name)
            for name, value in before.items():
                if vars(cls).get(name) is not value:
                    setattr(cls, name, value)


def layer_table(adapter: ModelAdapter, variables: Any, x: Any, width: int | None = None) -> str:
    """The model's layers in the order it calls them, each with its type, inputs, output shapes
    and parameters (Flax's ``tabulate``: linen's ``Module.tabulate``, ``nnx.tabulate``), for the
    inputs ``x`` (a batch of one sample: the batch axis shows as 1).

    A linen model is traced on abstract values (no computation). An NNX model runs once, on a
    copy of it made from ``variables`` (``(params, model_state)``) in evaluation mode: its
    random keys and batch statistics are left as they were. ``width`` (characters): longer cells
    wrap rather than being cut, so that every shape shows whole; None: as wide as the cells need.
    """
    console = {"width": _WIDE if width is None else int(width)}
    console.update(force_terminal=False, force_jupyter=False)  # plain text, also in a notebook
    columns = {"overflow": "fold"}
    if adapter.kind == "nnx":
        from flax import nnx

        model = nnx.merge(adapter.module, *variables, copy=True)
        model.eval()
        with _methods_kept(model):
            text = nnx.tabulate(model, x, console_kwargs=console, column_kwargs=columns)
    else:
        rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
        text = adapter.module.tabulate(
            rngs, x, console_kwargs=console, column_kwargs=columns, **adapter.eval_flags()
        )
    # up to the table's last line: the totals that follow it are summary's
    lines = text.rstrip().splitlines()
    last = max((i for i, line in enumerate(lines) if line.startswith("└")), default=len(lines) - 1)
    return "\n".join(line.rstrip() for line in lines[: last + 1]).strip("\n")


def _size(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that keeps it at least 1: ``30.7 KiB``."""
    size, unit = float(nbytes), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{nbytes} B" if unit == "B" else f"{size:,.1f} {unit}"


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
