"""Where each array of a training state lives on the mesh: ``Trainer(sharding=...)``.

Pure functions of the state's shapes (arrays or ``jax.ShapeDtypeStruct``) and the mesh's axis
sizes, so the same layout is derived at initialisation, for the compiled steps' outputs and for
a checkpoint's restore target:

- ``"replicated"`` (the default): every array whole on every device;
- ``"zero1"``: the optimizer's state (accumulated gradients included) and the moving average
  of the parameters sharded, the parameters replicated;
- ``"fsdp"``: the parameters and the model's other variables (BatchNorm statistics) sharded too;
- a list of ``(regex, PartitionSpec)`` rules over the parameters' paths: the first rule whose
  regex matches a path (``re.search``) gives the spec of that parameter and of the optimizer
  state and moving average that mirror it; arrays no rule matches are replicated. A spec may
  name any axis of the mesh (``"model"`` of ``Trainer(mesh={"data": -1, "model": 2})``: tensor
  parallel).

An array is sharded by big_vision's rule: along its largest dimension that the ``"data"``
axis's size divides (the next largest when it does not), and only when it holds more than
:data:`MIN_BYTES` (smaller arrays cost more to gather than they save). The step, the RNG key
and the loss scale are always replicated. Annotations already in the model (linen's
``nn.with_partitioning``, NNX's ``nnx.with_partitioning``) name mesh axes; they are honoured
under every sharding but ``"replicated"`` (a rule that matches the path wins).

A path is the parameter's keys joined by ``/``: ``Dense_0/kernel`` (linen), ``linear/kernel``
(NNX).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from easyfit.core.sharding import StateSharding, array_spec
    >>> from jax.sharding import PartitionSpec as P
    >>> array_spec(jax.ShapeDtypeStruct((1024, 2048), jnp.float32), 8) == P(None, "data")
    True
    >>> array_spec(jax.ShapeDtypeStruct((10, 64), jnp.float32), 8) == P()  # 2.5 KiB: replicated
    True
    >>> StateSharding.of([("Dense_0/kernel", ("data", None))]).kind
    'rules'
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..parallel import DATA_AXIS

__all__ = ["KINDS", "MIN_BYTES", "StateSharding", "array_spec", "path_of", "state_shardings", "state_specs"]

#: Arrays of at most this many bytes stay replicated under ``"zero1"`` and ``"fsdp"`` (4 MiB, as
#: big_vision's and Kauldron's FSDP rules).
MIN_BYTES = 4 << 20

KINDS = ("replicated", "zero1", "fsdp")


@dataclasses.dataclass(frozen=True)
class StateSharding:
    """A training state's layout on the mesh: ``kind`` (``"replicated"``, ``"zero1"``, ``"fsdp"``
    or ``"rules"``), the rules (``(compiled regex, PartitionSpec)``) for ``"rules"``, and the
    size above which the automatic rule shards an array (``min_bytes``)."""

    kind: str = "replicated"
    rules: tuple[tuple[re.Pattern[str], P], ...] = ()
    min_bytes: int = MIN_BYTES

    @classmethod
    def of(cls, sharding: Any, min_bytes: int = MIN_BYTES) -> StateSharding:
        """``Trainer(sharding=)``'s value checked: a kind's name, a list of ``(regex, spec)``
        rules (a spec: a ``PartitionSpec`` or a tuple of axis names and None), or a
        StateSharding.

        Raises:
            ValueError: an unknown name, a regex that does not compile, a spec that is not one.
        """
        if isinstance(sharding, StateSharding):
            return sharding
        if isinstance(sharding, str):
            if sharding not in KINDS:
                raise ValueError(f"sharding={sharding!r}: expected one of {KINDS} or a list of (regex, spec)")
            return cls(sharding, (), min_bytes)
        if not isinstance(sharding, Sequence) or not sharding:
            raise ValueError(
                f"sharding={sharding!r}: expected one of {KINDS} or a non-empty list of (regex, spec)"
            )
        rules = []
        for i, rule in enumerate(sharding):
            if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)):
                raise ValueError(f"sharding: rule {i} ({rule!r}) is not a (regex, PartitionSpec) pair")
            try:
                pattern = re.compile(rule[0])
            except re.error as e:
                raise ValueError(f"sharding: rule {i}'s regex {rule[0]!r} does not compile: {e}") from None
            spec = rule[1]
            if not isinstance(spec, P):
                if spec is None:
                    spec = P()
                elif isinstance(spec, (tuple, list)) and all(a is None or isinstance(a, str) for a in spec):
                    spec = P(*spec)
                else:
                    raise ValueError(
                        f"sharding: rule {i} ({rule[0]!r}): {spec!r} is not a PartitionSpec "
                        "(or a tuple of mesh axis names and None)"
                    )
            rules.append((pattern, spec))
        return cls("rules", tuple(rules), min_bytes)

    @property
    def name(self) -> str:
        """How the epoch line and ``easyfit info`` name it."""
        n = len(self.rules)
        return (f"{n} rule" + "s" * (n > 1)) if self.kind == "rules" else self.kind

    @property
    def sharded(self) -> bool:
        return self.kind != "replicated"


def path_of(keys: Iterable[Any]) -> str:
    """A pytree key path spelled as easyfit's rules match it: the keys joined by ``/``, without
    the key a flax box adds to its array's (``.value``)."""
    parts = []
    for k in keys:
        if _box_key(k):
            continue
        if isinstance(k, jax.tree_util.DictKey):
            parts.append(str(k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            parts.append(k.name)
        elif isinstance(k, jax.tree_util.SequenceKey):
            parts.append(str(k.idx))
        elif isinstance(k, jax.tree_util.FlattenedIndexKey):
            parts.append(str(k.key))
        else:
            parts.append(str(k))
    return "/".join(parts)


def _nbytes(a: Any) -> int:
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        return 0  # a key: replicated
    return math.prod(a.shape) * np.dtype(a.dtype).itemsize


def array_spec(a: Any, axis_size: int, min_bytes: int = MIN_BYTES) -> P:
    """big_vision's rule: ``a`` sharded over the data axis along its largest dimension that
    ``axis_size`` divides (the next largest when it does not), if it holds more than
    ``min_bytes``; else replicated (``P()``)."""
    shape = tuple(getattr(a, "shape", ()))
    if axis_size <= 1 or not shape or _nbytes(a) <= min_bytes:
        return P()
    for i in sorted(range(len(shape)), key=lambda d: (-shape[d], -d)):
        if shape[i] % axis_size == 0:
            return P(*[None] * i, DATA_AXIS)  # no trailing None: as XLA spells its outputs'
    return P()


def _boxed(x: Any) -> bool:
    """A flax box holding an array and its metadata: linen's ``AxisMetadata`` (``Partitioned``)
    or an NNX ``Variable``."""
    meta = sys.modules.get("flax.core.meta")
    if meta is not None and isinstance(x, meta.AxisMetadata):
        return True
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(x, nnx.Variable)


def _annotation(box: Any) -> tuple[Any, ...] | None:
    """The mesh axis names a box's metadata gives its array, or None."""
    names = getattr(box, "names", None)  # linen's Partitioned
    if names is None and hasattr(box, "get_metadata"):  # an NNX Variable
        meta = box.get_metadata()
        names = next((meta[k] for k in ("out_sharding", "sharding_names", "sharding") if meta.get(k)), None)
    return None if names is None else tuple(names)


def _unbox(x: Any) -> Any:
    if hasattr(x, "unbox"):
        return x.unbox()
    return x.get_value() if hasattr(x, "get_value") else x.value


def _map(fn: Any, tree: Any) -> Any:
    """``fn(path, array, annotation)`` over ``tree``'s arrays, boxes kept in place (their
    arrays replaced), paths without the boxes' own keys."""

    def one(keys: Any, x: Any) -> Any:
        if _boxed(x):
            spec = fn(path_of(keys), _unbox(x), _annotation(x))
            if hasattr(x, "replace_boxed"):
                return x.replace_boxed(spec)
            return x.replace(spec) if hasattr(x, "replace") else type(x)(spec)
        return fn(path_of(keys), x, None)

    return jax.tree_util.tree_map_with_path(one, tree, is_leaf=_boxed)


def _check_spec(spec: P, a: Any, axes: Mapping[str, int], path: str, why: str) -> P:
    shape = tuple(a.shape)
    if len(spec) > len(shape):
        raise ValueError(f"sharding: {path} of shape {shape}: {why} {spec} names more dimensions than it has")
    for dim, names in zip(shape, spec, strict=False):
        for name in (names,) if isinstance(names, str) else names or ():
            if name not in axes:
                raise ValueError(
                    f"sharding: {path}: {why} {spec} names mesh axis {name!r}; the mesh has {sorted(axes)}"
                )
        size = math.prod(axes[n] for n in ((names,) if isinstance(names, str) else names or ()))
        if dim % size:
            raise ValueError(
                f"sharding: {path} of shape {shape}: {why} {spec} splits a dimension of {dim} "
                f"over {size} devices, which does not divide it"
            )
    return _trimmed(spec)


def _trimmed(spec: P) -> P:
    """``spec`` without trailing Nones, as XLA spells the shardings of a step's outputs: the
    state then comes back from a step with the very shardings it went in with (else the step's
    first call and the next have different signatures)."""
    parts = list(spec)
    while parts and parts[-1] is None:
        parts.pop()
    return P(*parts)


def state_specs(state: Any, sharding: StateSharding, axes: Mapping[str, int]) -> Any:
    """The PartitionSpec of each array of a TrainState (its ``P`` leaves where the state has
    arrays; boxes kept), for a mesh of axis sizes ``axes`` (``{"data": 8}``).

    Raises:
        ValueError: a rule or an annotation names an axis the mesh lacks, or splits a dimension
            the axis's size does not divide (naming the parameter's path).
    """
    size = axes.get(DATA_AXIS, 1)
    replicated = lambda tree: _map(lambda path, a, names: P(), tree)  # noqa: E731
    if not sharding.sharded:
        return state.replace(**{k: replicated(getattr(state, k)) for k in _FIELDS})

    def auto(path: str, a: Any, names: Any) -> P:
        if names is not None:
            return _check_spec(P(*names), a, axes, path, "its annotation")
        return array_spec(a, size, sharding.min_bytes)

    def by_rule(path: str, a: Any, names: Any) -> P:
        for pattern, spec in sharding.rules:
            if pattern.search(path):
                return _check_spec(spec, a, axes, path, f"rule {pattern.pattern!r}:")
        if names is not None:
            return _check_spec(P(*names), a, axes, path, "its annotation")
        return P()

    if sharding.kind == "rules":
        params = _map(by_rule, state.params)
        mirror = _mirror(state.params, params)
        opt_state, ema = _map(mirror, state.opt_state), _map(mirror, state.ema_params)
        model_state = _map(by_rule, state.model_state)
    else:
        fsdp = sharding.kind == "fsdp"
        params = _map(auto, state.params) if fsdp else _map(_annotated(axes), state.params)
        mirror = _mirror(state.params, params)  # annotated parameters: their state alike
        opt_state = _map(lambda path, a, names: mirror(path, a, names, auto), state.opt_state)
        ema = _map(lambda path, a, names: mirror(path, a, names, auto), state.ema_params)
        model_state = _map(auto if fsdp else _annotated(axes), state.model_state)
    return state.replace(
        step=P(),
        rng=replicated(state.rng),
        dynamic_scale=replicated(state.dynamic_scale),
        params=params,
        opt_state=opt_state,
        ema_params=ema,
        model_state=model_state,
    )


_FIELDS = ("step", "params", "opt_state", "model_state", "rng", "dynamic_scale", "ema_params")


def _annotated(axes: Mapping[str, int]) -> Any:
    def spec(path: str, a: Any, names: Any) -> P:
        return P() if names is None else _check_spec(P(*names), a, axes, path, "its annotation")

    return spec


def _mirror(params: Any, specs: Any) -> Any:
    """``(path, array, annotation[, fallback]) -> spec`` for the optimizer state and the moving
    average: an array whose path ends with a parameter's and has its shape takes that
    parameter's spec when it is not replicated, else the ``fallback``'s (replicated by default)."""
    by_path: dict[str, tuple[tuple[int, ...], P]] = {}
    shapes = _map(lambda path, a, names: tuple(a.shape), params)
    flat_shapes = jax.tree_util.tree_leaves_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple))
    flat_specs = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, P))
    for (keys, shape), spec in zip(flat_shapes, flat_specs, strict=True):
        by_path["/" + path_of(keys)] = (shape, spec)

    def mirrored(path: str, a: Any, names: Any, fallback: Any = None) -> P:
        full = "/" + path
        for p, (shape, s) in by_path.items():
            if full.endswith(p) and tuple(a.shape) == shape and len(s):
                return s
        return fallback(path, a, names) if fallback is not None else P()

    return mirrored


def _box_key(k: Any) -> bool:
    """The key a box adds to its array's path (``.value``), which rules do not spell."""
    return isinstance(k, jax.tree_util.GetAttrKey) and k.name in ("value", "raw_value")


def state_shardings(state: Any, sharding: StateSharding, mesh: Mesh) -> Any:
    """:func:`state_specs` as NamedShardings on ``mesh``."""
    specs = state_specs(state, sharding, dict(mesh.shape))
    return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def specs_by_path(tree: Any, shardings: Any) -> dict[str, tuple[Any, int]]:
    """``{path: (PartitionSpec, bytes per device)}`` of ``tree``'s arrays placed by
    ``shardings`` (a NamedSharding per array): what ``summary`` shows."""
    out: dict[str, tuple[Any, int]] = {}
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    for (keys, a), s in zip(leaves, jax.tree_util.tree_leaves(shardings), strict=True):
        shard = s.shard_shape(tuple(a.shape))
        out[path_of(keys)] = (
            s.spec,
            math.prod(shard) * np.dtype(a.dtype).itemsize,
        )
    return out


class StateLayout:
    """A :class:`StateSharding` on a mesh: the shardings of a state, its placement, and its
    abstract form (a target to compile or restore to).

    Args:
        sharding: the layout's rules.
        mesh: the mesh (``Placement.mesh``: a ``"data"`` axis, and any other of ``Trainer(mesh=)``).
    """

    def __init__(self, sharding: StateSharding, mesh: Mesh):
        self.sharding, self.mesh = sharding, mesh
        self._replicated = NamedSharding(mesh, P())

    @property
    def sharded(self) -> bool:
        """Whether any array may be split (else every array is replicated)."""
        return self.sharding.sharded and self.mesh.devices.size > 1

    def shardings(self, state: Any) -> Any:
        """A NamedSharding per array of ``state`` (arrays, ``jax.ShapeDtypeStruct`` or tracers)."""
        if not self.sharded:
            return jax.tree_util.tree_map(lambda _: self._replicated, state)
        return state_shardings(state, self.sharding, self.mesh)

    def place(self, state: Any) -> Any:
        """``state`` on the mesh, each array as :meth:`shardings` says (a host array shard by
        shard; one already placed so, as it is)."""
        return jax.device_put(state, self.shardings(state))

    def abstract(self, state: Any) -> Any:
        """Shapes, dtypes and the shardings of :meth:`place`, as ``jax.ShapeDtypeStruct`` leaves."""
        return jax.tree_util.tree_map(
            lambda a, s: jax.ShapeDtypeStruct(
                a.shape, a.dtype, sharding=s, weak_type=getattr(a, "weak_type", False)
            ),
            state,
            self.shardings(state),
        )

    def constrain(self, state: Any) -> Any:
        """Inside a jitted function: ``state`` held to :meth:`shardings` (the compiled step's
        outputs, as the next step takes them)."""
        return jax.lax.with_sharding_constraint(state, self.shardings(state))

    def describe(self) -> str:
        """The layout in force, as fit's log and ``summary`` name it."""
        n = self.mesh.devices.size
        if len(self.mesh.axis_names) == 1:
            return f"{self.sharding.name} over {n} devices ('{DATA_AXIS}' axis)"
        names = " x ".join(f"'{a}'" for a in self.mesh.axis_names)
        sizes = " x ".join(str(v) for v in self.mesh.shape.values())
        return f"{self.sharding.name} over {n} devices ({names} axes: {sizes})"

    @staticmethod
    def parts(state: Any) -> dict[str, Any]:
        """The state's parts as ``summary`` lists them."""
        parts = {"params": state.params, "model state": state.model_state, "optimizer": state.opt_state}
        return parts if state.ema_params is None else {**parts, "EMA": state.ema_params}
