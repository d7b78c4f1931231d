"""Mixed precision: the dtype the model computes in, with float32 master weights.

``precision="float32"`` (the default) computes in float32. ``"bfloat16"`` keeps the parameters and
the optimizer state in float32 and casts parameters and inputs to bfloat16 inside the step, so
the forward and backward passes run in bfloat16; outputs are cast back to float32 before the
loss and the metrics. ``"float16"`` does the same in float16 and adds dynamic loss scaling
(Flax's :class:`~flax.training.dynamic_scale.DynamicScale`): a step whose gradients are not
finite is skipped and the scale halves; after 2,000 finite steps it doubles. The model's other
variables (BatchNorm statistics) keep their own dtype, float32.

Keras' policy names (``"mixed_bfloat16"``, ``"mixed_float16"``) and the short ones (``"bf16"``,
``"fp16"``, ``"fp32"``) are accepted too.

Example:
    >>> import jax.numpy as jnp
    >>> from easyfit.core.precision import get_precision
    >>> p = get_precision("mixed_bfloat16")
    >>> p.name, p.cast({"w": jnp.ones(2)})["w"].dtype, p.loss_scaling
    ('bfloat16', dtype(bfloat16), False)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax.training.dynamic_scale import DynamicScale

__all__ = ["Precision", "get_precision"]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_ALIASES = {
    "fp32": "float32",
    "f32": "float32",
    "mixed_bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "mixed_float16": "float16",
    "fp16": "float16",
    "f16": "float16",
}


def _key(a: Any) -> bool:
    """Whether ``a`` is a typed PRNG key (an NNX ``Rngs`` or ``Dropout`` state): never cast."""
    return hasattr(a, "dtype") and jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key)


def _floating(a: Any) -> bool:
    return hasattr(a, "dtype") and not _key(a) and jnp.issubdtype(a.dtype, jnp.floating)


@dataclasses.dataclass(frozen=True)
class Precision:
    """A precision policy; built by :func:`get_precision`.

    Attributes:
        name: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
    """

    name: str = "float32"

    @property
    def compute_dtype(self) -> Any:
        """The dtype of the forward and backward passes."""
        return _DTYPES[self.name]

    @property
    def loss_scaling(self) -> bool:
        """Whether the loss is scaled dynamically (float16 only)."""
        return self.name == "float16"

    def cast(self, tree: Any) -> Any:
        """``tree`` with its floating-point leaves in the compute dtype."""
        if self.name == "float32":
            return tree
        return jax.tree_util.tree_map(lambda a: a.astype(self.compute_dtype) if _floating(a) else a, tree)

    @staticmethod
    def to_float32(tree: Any) -> Any:
        """``tree`` with its floating-point leaves in float32 (outputs, before the loss)."""
        return jax.tree_util.tree_map(lambda a: a.astype(jnp.float32) if _floating(a) else a, tree)

    @staticmethod
    def like(tree: Any, reference: Any) -> Any:
        """``tree`` cast leaf by leaf to ``reference``'s dtypes (the model state a step returns
        keeps the dtypes it came in with, whatever the compute dtype); typed PRNG keys as they are."""
        return jax.tree_util.tree_map(lambda a, r: a if _key(a) else a.astype(r.dtype), tree, reference)

    def initial_scale(self) -> DynamicScale | None:
        """A fresh loss scale for float16, else None."""
        if not self.loss_scaling:
            return None
        # arrays, not Python numbers (as Flax's annotations say): the step's carry keeps its types
        return DynamicScale(
            fin_steps=jnp.zeros((), jnp.int32),  # type: ignore[arg-type]
            scale=jnp.asarray(2.0**15, jnp.float32),  # type: ignore[arg-type]
        )


def get_precision(precision: str | Precision) -> Precision:
    """The policy named ``precision``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if isinstance(precision, Precision):
        return precision
    name = _ALIASES.get(str(precision).lower(), str(precision).lower())
    if name not in _DTYPES:
        raise ValueError(
            f"precision={precision!r}: unknown; expected one of {sorted(_DTYPES) + sorted(_ALIASES)}"
        )
    return Precision(name)
