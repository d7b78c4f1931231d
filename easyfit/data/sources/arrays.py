"""In-memory NumPy arrays, fed through DALI's ``external_source``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import DataError
from ..augment import apply_drawn, refuse_random_crop
from .base import IndexedSource, nonfinite_problem

__all__ = ["Arrays"]


class Arrays(IndexedSource):
    """Samples held in NumPy arrays, as in Keras' ``fit(x, y)``.

    ``x`` keeps its dtype through DALI (uint8 images travel as bytes) and reaches the model as
    float32, multiplied by ``scale`` when one is given (Keras semantics: no scaling by default).

    Args:
        x: inputs, one row per sample (for images NHWC).
        y: labels, one row per sample (integers for class indices); None for predict-only data.
        scale: factor applied to ``x`` after casting to float32 (``1/255`` for 8-bit images
            you want in [0, 1]); None to leave the values as they are.
        class_names: optional names of the classes.
        augment: optional ``f(x) -> x`` on DALI data nodes for training batches only (for NHWC
            image arrays, e.g. ``easyfit.data.Augment(flip=True)``).

    Example:
        >>> import numpy as np, easyfit as ef
        >>> src = ef.data.Arrays(np.zeros((4, 28, 28, 1), np.uint8), np.array([0, 1, 2, 3]))
        >>> len(src)
        4
        >>> ef.data.Arrays(np.zeros((4, 2)), np.zeros(3))
        Traceback (most recent call last):
        ...
        easyfit.errors.DataError: x has 4 samples but y has 3
    """

    def __init__(
        self,
        x: Any,
        y: Any = None,
        *,
        scale: float | None = None,
        class_names: Sequence[str] | None = None,
        augment: Callable[[Any], Any] | None = None,
    ):
        x = np.asarray(x)
        if x.ndim < 1 or len(x) == 0:
            raise DataError(f"x: expected an array with one row per sample, got shape {x.shape}")
        if y is None:
            y = np.zeros(len(x), np.int32)
        y = np.asarray(y)
        if len(x) != len(y):
            raise DataError(f"x has {len(x)} samples but y has {len(y)}")
        for name, a in (("x", x), ("y", y)):
            problem = nonfinite_problem(a, unit="sample")
            if problem:
                raise DataError(f"{name} {problem}")
            if a.dtype.kind not in "biuf":
                raise DataError(f"{name}: dtype {a.dtype} is not numeric")
        if x.dtype == np.float64:
            x = x.astype(np.float32)
        if y.dtype.kind in "biu":
            y = y.astype(np.int32)
        elif y.dtype != np.float32:
            y = y.astype(np.float32)
        self.x = np.ascontiguousarray(x)
        self.y = np.ascontiguousarray(y)
        self.scale = scale
        self.class_names = list(class_names) if class_names is not None else None
        refuse_random_crop(augment, "Arrays")
        self.augment = augment

    @property
    def num_samples(self) -> int:
        return len(self.x)

    @property
    def num_feeds(self) -> int:
        return 2

    @property
    def label_dtype(self) -> np.dtype:
        return self.y.dtype

    @property
    def sample_nbytes(self) -> int:
        return self.x[0].nbytes + self.y[0].nbytes

    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        return self.x[indices], self.y[indices]

    def known_labels(self) -> np.ndarray:
        return self.y

    def locate(self, index: int) -> str:
        return f"x[{index}]"

    def graph(self, *nodes: Any, device: str, draws: dict[str, Any] | None = None) -> tuple[Any, Any]:
        x, y = nodes  # as feed() returns them
        if self.x.ndim == 4:  # images: name the layout for DALI's image operators
            from nvidia.dali import fn

            x = fn.reshape(x, layout="HWC")
        if draws is not None:
            x = apply_drawn(self.augment, x, draws)
        if device == "gpu":
            return x.gpu(), y.gpu()
        return x, y

    def describe(self) -> str:
        return f"Arrays(x{tuple(self.x.shape)} {self.x.dtype}, y{tuple(self.y.shape)} {self.y.dtype})"
