"""Flax linen and NNX models behind one pure ``(init, apply)`` pair.

``apply(params, model_state, x, train, rng) -> (outputs, model_state)``: ``params`` are what the
optimizer updates; ``model_state`` is everything else the model carries (linen collections such
as ``batch_stats``, NNX batch statistics and RNG counters).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import jax
import jax.numpy as jnp
from flax import linen as nn

from ..errors import DataError

if TYPE_CHECKING:  # imported where an NNX model is met: a linen model's fit never needs it
    from flax import nnx

__all__ = [
    "ModelAdapter",
    "adapt",
    "example_input",
    "input_spec",
    "is_nnx",
    "write_back",
]

_TRAIN_FLAGS = {"train": True, "training": True, "is_training": True, "deterministic": False}


@dataclasses.dataclass(frozen=True)
class ModelAdapter:
    """A model as pure functions; built by ``adapt``."""

    kind: str  # "linen" | "nnx"
    module: Any  # the linen module, or the NNX graphdef
    train_flag: str | None = None
    # one sample's output shapes by input shapes, noted by ``init``'s trace (a linen init runs
    # the model as ``apply`` with ``train=False`` does): ``output_shapes`` need not trace again
    _outputs: dict[Any, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def init(self, rng: jax.Array, x: jax.Array, nnx_state: Any = None) -> tuple[Any, Any]:
        if self.kind == "nnx":
            return nnx_state
        kwargs = self._flag(train=False)
        p_rng, d_rng = jax.random.split(rng)
        with _keys_named(x):
            out, variables = self.module.init_with_output({"params": p_rng, "dropout": d_rng}, x, **kwargs)
        if all(hasattr(o, "shape") for o in jax.tree_util.tree_leaves(out)):
            self._outputs[_shapes_key(x)] = _sample_shapes(out)
        variables = dict(variables)
        params = variables.pop("params", {})
        return params, variables

    def apply(
        self, params: Any, model_state: Any, x: jax.Array, train: bool, rng: jax.Array | None = None
    ) -> tuple[jax.Array, Any]:
        if self.kind == "nnx":
            from flax import nnx

            # copy: Variables of this trace, which BatchNorm may update in place under jax.grad
            model = nnx.merge(self.module, params, model_state, copy=True)
            model.train() if train else model.eval()
            with _keys_named(x):  # an NNX model first meets its inputs here
                out = model(x)
            _, _, new_state = _split(model)
            return out, new_state
        variables = {"params": params, **model_state}
        kwargs = self._flag(train)
        rngs = {"dropout": rng} if rng is not None else None
        if train and model_state:
            out, updates = self.module.apply(variables, x, rngs=rngs, mutable=list(model_state), **kwargs)
            return out, {**model_state, **updates}
        return self.module.apply(variables, x, rngs=rngs, **kwargs), model_state

    def num_outputs(self, params: Any, model_state: Any, input_shape: Any) -> Any:
        """Size of the last output axis for inputs of ``input_shape`` (no computation); for a
        model with several outputs, a dict or tuple of sizes. ``input_shape``: one sample's
        shape, or a dict or list of them (see :func:`input_spec`)."""
        shapes = self.output_shapes(params, model_state, input_shape)
        return jax.tree_util.tree_map(lambda s: s[-1] if s else 1, shapes, is_leaf=_is_shape)

    def output_shapes(self, params: Any, model_state: Any, input_shape: Any) -> Any:
        """One sample's output shape (a tuple, the batch axis left out) for inputs of
        ``input_shape`` (no computation); for several outputs, a dict or tuple of them."""
        x = example_input(input_shape, abstract=True)
        known = self._outputs.get(_shapes_key(x))
        if known is not None:
            return known
        out = jax.eval_shape(lambda p, m, x: self.apply(p, m, x, False)[0], params, model_state, x)
        return _sample_shapes(out)

    def eval_flags(self) -> dict[str, bool]:
        """The keyword that puts a linen model in evaluation mode (``{"train": False}``), if it
        takes one."""
        return self._flag(train=False)

    def _flag(self, train: bool) -> dict[str, bool]:
        if self.train_flag is None:
            return {}
        on = _TRAIN_FLAGS[self.train_flag]
        return {self.train_flag: on if train else not on}


@contextlib.contextmanager
def _keys_named(x: Any) -> Iterator[None]:
    """A KeyError of the model for a key that a dict of inputs ``x`` lacks, as a DataError
    naming the keys given (the model's own message names only the key it asked for)."""
    try:
        yield
    except KeyError as e:
        key = e.args[0] if len(e.args) == 1 else None
        if not isinstance(x, Mapping) or not isinstance(key, str) or key in x:
            raise
        raise DataError(
            f"x: the model asked for the input {key!r} (KeyError), but the dict of inputs given "
            f"has the keys {list(x)}; name each array of x by the key the model reads"
        ) from e


def _sample_shapes(outputs: Any) -> Any:
    """One sample's shape (the batch axis left out) of each output."""
    return jax.tree_util.tree_map(lambda o: tuple(int(d) for d in o.shape[1:]), outputs)


def _shapes_key(x: Any) -> Any:
    """A hashable description of the inputs' structure, shapes and dtypes."""
    leaves, tree = jax.tree_util.tree_flatten(x)
    return tree, tuple((tuple(a.shape), str(a.dtype)) for a in leaves)


def input_spec(x: Any) -> tuple[Any, Any]:
    """``(shape, dtype)`` of one sample of a batch ``x``, as JSON values (what a checkpoint
    records): a list of ints and a dtype name; for a dict or a tuple of inputs, a dict or a
    list of those.

    Example:
        >>> import numpy as np
        >>> from easyfit.core.models import input_spec
        >>> input_spec(np.zeros((8, 28, 28, 1), np.uint8))
        ([28, 28, 1], 'uint8')
        >>> input_spec({"image": np.zeros((8, 4)), "extra": np.zeros((8,), np.int32)})
        ({'image': [4], 'extra': []}, {'image': 'float64', 'extra': 'int32'})
    """
    if isinstance(x, dict):
        specs = {k: input_spec(v) for k, v in x.items()}
        return {k: s for k, (s, _) in specs.items()}, {k: d for k, (_, d) in specs.items()}
    if isinstance(x, (tuple, list)):
        pairs = [input_spec(v) for v in x]
        return [s for s, _ in pairs], [d for _, d in pairs]
    return [int(d) for d in x.shape[1:]], str(x.dtype)


def _is_shape(spec: Any) -> bool:
    return isinstance(spec, (list, tuple)) and all(isinstance(d, int) for d in spec)


def example_input(shape: Any, abstract: bool = False) -> Any:
    """A batch of one zero sample (float32) of ``shape`` (from :func:`input_spec`: a shape, or a
    dict or list of shapes for several inputs, given to the model as a dict or a tuple); with
    ``abstract``, ``jax.ShapeDtypeStruct`` leaves.

    Example:
        >>> from easyfit.core.models import example_input
        >>> {k: v.shape for k, v in example_input({"image": [4], "extra": []}).items()}
        {'image': (1, 4), 'extra': (1,)}
    """
    if isinstance(shape, dict):
        return {k: example_input(v, abstract) for k, v in shape.items()}
    if not _is_shape(shape):  # a list of shapes: a tuple of inputs
        return tuple(example_input(v, abstract) for v in shape)
    full = (1, *map(int, shape))
    return jax.ShapeDtypeStruct(full, jnp.float32) if abstract else jnp.zeros(full, jnp.float32)


def _split(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """``nnx.split(model, nnx.Param, ...)``: the graph, the parameters, every other variable."""
    from flax import nnx

    # flax annotates a split by n filters as "at least two parts"; two filters give three
    return cast("tuple[nnx.GraphDef, nnx.State, nnx.State]", nnx.split(model, nnx.Param, ...))


def is_nnx(model: Any) -> bool:
    """Whether ``model`` is a ``flax.nnx.Module``. Such a model exists only once ``flax.nnx`` is
    imported, which easyfit leaves to the code that made it: a linen model's process never
    pays that import."""
    module = sys.modules.get("flax.nnx")
    return module is not None and isinstance(model, module.Module)


def adapt(model: Any) -> tuple[ModelAdapter, Any]:
    """Wraps a linen or NNX module.

    Returns:
        The adapter, and for NNX the ``(params, model_state)`` split off the module (None for
        linen, which is initialised later from the first batch).

    Raises:
        TypeError: ``model`` is neither.
    """
    if is_nnx(model):
        graphdef, params, rest = _split(model)
        return ModelAdapter("nnx", graphdef), (params, rest)
    if isinstance(model, nn.Module):
        arguments = inspect.signature(type(model).__call__).parameters
        flag = next((f for f in _TRAIN_FLAGS if f in arguments), None)
        return ModelAdapter("linen", model, flag), None
    raise TypeError(f"model: expected a flax.linen.Module or a flax.nnx.Module, got {type(model).__name__}")


def write_back(model: Any, state: Any) -> None:
    """Puts a TrainState's parameters and variables into the user's NNX ``model``, so that it
    holds the trained weights after ``fit``, as a Keras model does (their moving average under
    ``ema_momentum``, as Keras' ``use_ema`` leaves them). Copies: the next ``fit``
    donates the state's buffers. A linen module holds no weights: nothing to do.
    """
    if not is_nnx(model) or state is None:
        return
    ema = getattr(state, "ema_params", None)  # the weights evaluation uses (ema_momentum=)
    variables = (state.params if ema is None else ema, state.model_state)
    if any(getattr(a, "is_deleted", lambda: False)() for a in jax.tree_util.tree_leaves(variables)):
        return  # a step failed after donating them: the module keeps what it last held
    from flax import nnx

    nnx.update(model, *jax.tree_util.tree_map(jnp.copy, variables))
