"""Structured arrays: ``x`` or ``y`` as a dict or a tuple of arrays (several inputs, several
outputs), one level deep, as Keras' ``fit`` takes them.

A :class:`Structure` says how one argument is laid out; the arrays travel through DALI as its
flat list of leaves (one ``external_source`` output each) and the batch is rebuilt in the same
layout, so the model receives the dict or tuple it was given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import DataError

__all__ = ["Structure", "as_array"]


def as_array(name: str, data: Any) -> np.ndarray:
    """``np.asarray(data)``, with a DataError naming ``name`` when ``data`` is a list of arrays
    of different shapes (numpy's "inhomogeneous shape"), such as a list of batches.

    Example:
        >>> import numpy as np
        >>> from easyfit.data.structured_arrays import as_array
        >>> as_array("x", [np.zeros((2, 3)), np.zeros((1, 3))])
        Traceback (most recent call last):
        ...
        easyfit.errors.DataError: x: a list whose items differ in shape ((2, 3) and (1, 3)) ...
    """
    try:
        return np.asarray(data)
    except ValueError:
        if not isinstance(data, (list, tuple)):
            raise
        first = np.shape(data[0])
        other = next((np.shape(item) for item in data if np.shape(item) != first), first)
        raise DataError(
            f"{name}: a list whose items differ in shape ({first} and {other}) cannot be "
            "one array of samples. For several inputs or outputs pass a dict or a tuple of arrays "
            "(one row per sample each); a list of batches: join them first (np.concatenate)"
        ) from None


@dataclasses.dataclass(frozen=True)
class Structure:
    """The layout of one argument: an array (``keys`` None), a dict (``keys`` its keys, in the
    given order) or a tuple (``keys`` the indices).

    Example:
        >>> import numpy as np
        >>> from easyfit.data.structured_arrays import Structure
        >>> s, leaves = Structure.of("x", {"image": np.zeros((4, 2)), "extra": np.ones(4)})
        >>> s.names, [a.shape for a in leaves]
        (["x['image']", "x['extra']"], [(4, 2), (4,)])
        >>> sorted(s.unflatten(leaves))
        ['extra', 'image']
    """

    argument: str
    kind: str  # "array" | "dict" | "tuple"
    keys: tuple[Any, ...] = ()

    @classmethod
    def of(cls, argument: str, data: Any) -> tuple[Structure, list[np.ndarray]]:
        """The structure of ``data`` and its leaves as arrays (lists become arrays: a list is
        one array, as in NumPy; a tuple or a dict holds several)."""
        if isinstance(data, Mapping):
            keys = tuple(data)
            if not keys:
                raise DataError(f"{argument}: an empty dict; expected arrays, one row per sample")
            for k in keys:
                if not isinstance(k, str) or (argument == "y" and not k.isidentifier()):
                    raise DataError(
                        f"{argument}: key {k!r} is not a name; keys of a dict of "
                        + (
                            "outputs name the logs (<key>_loss): letters, digits and _"
                            if argument == "y"
                            else "inputs are strings"
                        )
                    )
            structure = cls(argument, "dict", keys)
            items = [data[k] for k in keys]
        elif isinstance(data, tuple):
            if not data:
                raise DataError(f"{argument}: an empty tuple; expected arrays, one row per sample")
            structure = cls(argument, "tuple", tuple(range(len(data))))
            items = list(data)
        else:
            return cls(argument, "array"), [as_array(argument, data)]
        leaves = []
        for name, item in zip(structure.names, items, strict=True):
            if isinstance(item, (Mapping, tuple)):
                raise DataError(
                    f"{name}: a {type(item).__name__} inside a {structure.kind}; {argument} may be an array, "
                    "or a dict or a tuple of arrays (one level)"
                )
            leaves.append(as_array(name, item))
        return structure, leaves

    @property
    def structured(self) -> bool:
        """Whether this is a dict or a tuple (not a single array)."""
        return self.kind != "array"

    @property
    def names(self) -> list[str]:
        """Each leaf's name, for messages: ``x``, ``x['image']``, ``y[0]``."""
        if not self.structured:
            return [self.argument]
        return [f"{self.argument}[{k!r}]" for k in self.keys]

    def __len__(self) -> int:
        return len(self.keys) if self.structured else 1

    def unflatten(self, leaves: Sequence[Any]) -> Any:
        """The leaves (in :attr:`names`' order) in this layout."""
        if self.kind == "dict":
            return dict(zip(self.keys, leaves, strict=True))
        if self.kind == "tuple":
            return tuple(leaves)
        (leaf,) = leaves
        return leaf
