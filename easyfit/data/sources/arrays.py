"""In-memory NumPy arrays, fed through DALI's ``external_source``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import DataError
from ..augment import apply_drawn, refuse_random_crop
from ..recipe import ImageRecipe
from ..structured_arrays import Structure
from .base import IndexedSource, base_of, int32_labels, narrowed, nonfinite_problem, plain_names

__all__ = ["Arrays", "unscaled_note"]


def _leaf(name: str, a: np.ndarray, label: bool) -> np.ndarray:
    """A checked leaf in the dtype the model receives: float64 -> float32, 64-bit integers as
    JAX narrows them (each value checked to fit); integer labels int32, other labels float32."""
    problem = nonfinite_problem(a, unit="sample")
    if problem:
        raise DataError(f"{name} {problem}")
    if a.dtype.kind not in "biuf":
        fix = (
            "; for labels that are names, give their indices and keep the names: "
            "names, y = np.unique(y, return_inverse=True), then "
            "fit(ef.data.Arrays(x, y, class_names=list(names)))"
            if label
            else ""
        )
        raise DataError(f"{name}: dtype {a.dtype} is not numeric{fix}")
    if label and a.dtype.kind in "biu":  # range-checked before the cast: a cast would wrap
        return np.ascontiguousarray(int32_labels(a, lambda i: f"{name} (at x[{i}])"))
    # checked once here, not per step: JAX would narrow int64 silently on the way to the devices
    a, problem = narrowed(a, np.float32 if label else None)
    if problem:
        raise DataError(f"{name}: {problem}")
    if not label and a.dtype.kind in "iu" and a.dtype.itemsize >= 4 and a.size:
        # integer inputs reach the model as float32: a value it cannot hold would be rounded
        wide = a.astype(np.float64)
        rounded = wide != a.astype(np.float32).astype(np.float64)
        if rounded.any():
            at = np.unravel_index(int(np.argmax(rounded)), a.shape)
            raise DataError(
                f"{name}: value {a[at]} at [{', '.join(map(str, at))}] would be rounded: integer "
                "inputs reach the model as float32, which holds every integer only up to 2**24 "
                "(16777216). Give values that fit (ids renumbered: np.unique(x, return_inverse=True)[1])"
            )
    return np.ascontiguousarray(a)


def _weights(sample_weight: Any, n: int) -> np.ndarray:
    w = np.asarray(sample_weight)
    if w.ndim == 2 and w.shape[1] == 1:
        w = w[:, 0]
    if w.ndim != 1 or w.dtype.kind not in "biuf":
        raise DataError(f"sample_weight: expected one number per sample, got shape {w.shape} {w.dtype}")
    if len(w) != n:
        raise DataError(f"sample_weight has {len(w)} samples but x has {n}")
    w, problem = narrowed(w, np.float32)
    if problem:
        raise DataError(f"sample_weight: {problem}")
    if not np.isfinite(w).all() or (w < 0).any():
        i = int(np.flatnonzero(~np.isfinite(w) | (w < 0))[0])
        raise DataError(f"sample_weight[{i}]={w[i]}: weights must be finite and >= 0")
    return w


class Arrays(IndexedSource):
    """Samples held in NumPy arrays, as in Keras' ``fit(x, y)``.

    ``x`` keeps its dtype through DALI (uint8 images travel as bytes) and reaches the model as
    float32, multiplied by ``scale`` when one is given (Keras semantics: no scaling by default).
    float64 arrays are taken as float32, and int64 and uint64 ones as 32-bit integers where
    JAX's 64-bit mode is off; a value those casts would change is refused (DataError).

    ``x`` and ``y`` may each be a dict or a tuple of arrays (several inputs, several outputs;
    dense targets such as masks or boxes of a fixed size): every array holds one row per
    sample, travels through DALI on its own, is sharded on its rows and shuffled with its
    sample; the model receives the same dict or tuple.

    Args:
        x: inputs, one row per sample (for images NHWC); or a dict or tuple of such arrays.
        y: labels, one row per sample (integers for class indices), or a dict or tuple of
            such arrays (one per output); None for predict-only data.
        sample_weight: one weight (>= 0) per sample, multiplying its loss (Keras'
            ``sample_weight``); None for none.
        scale: factor applied to every array of ``x`` after casting to float32 (``1/255`` for
            8-bit images you want in [0, 1]); None to leave the values as they are.
        class_names: optional names of the classes.
        images: an :class:`~easyfit.data.recipe.ImageRecipe`: ``x`` is one uint8 NHWC array of
            images, prepared as evaluation prepares decoded files (resize, center crop,
            normalisation); ``scale`` is then the recipe's. Prediction and evaluation after
            training on images (or loading a model trained on them) pass it for uint8 arrays.
        augment: optional ``f(x) -> x`` on DALI data nodes for training batches only (for NHWC
            image arrays, e.g. ``easyfit.data.Augment(flip=True)``); a single array ``x`` only.

    Example:
        >>> import numpy as np, easyfit as ef
        >>> src = ef.data.Arrays(np.zeros((4, 28, 28, 1), np.uint8), np.array([0, 1, 2, 3]))
        >>> len(src)
        4
        >>> ef.data.Arrays(np.zeros((4, 2)), np.zeros(3))
        Traceback (most recent call last):
        ...
        easyfit.errors.DataError: x has 4 samples but y has 3
        >>> two = ef.data.Arrays({"image": np.zeros((4, 8, 8, 1)), "extra": np.ones((4, 3))},
        ...                      (np.arange(4), np.zeros((4, 2))), sample_weight=[1, 1, 0, 2])
        >>> two.outputs
        ("x['image']", "x['extra']", 'y[0]', 'y[1]', 'sample_weight')
    """

    def __init__(
        self,
        x: Any,
        y: Any = None,
        *,
        sample_weight: Any = None,
        scale: float | None = None,
        class_names: Sequence[str] | None = None,
        augment: Callable[[Any], Any] | None = None,
        images: ImageRecipe | None = None,
    ):
        self._xs, x_leaves = Structure.of("x", x)
        if images is not None:
            if self._xs.structured or x_leaves[0].dtype != np.uint8:
                raise ValueError("Arrays: images= takes one uint8 array of images x")
            one = x_leaves[0].shape == images.shape  # one image without its batch axis: said so
            if x_leaves[0].ndim == 3 and images.channels == 1 and not one:  # (n, h, w) grayscale
                x_leaves = [x_leaves[0][..., None]]
            images.check_array(x_leaves[0].shape)
            scale = images.scale
        self.images = images
        if any(a.ndim < 1 or len(a) == 0 for a in x_leaves):
            shape = next(a.shape for a in x_leaves if a.ndim < 1 or len(a) == 0)
            raise DataError(f"x: expected an array with one row per sample, got shape {shape}")
        n = len(x_leaves[0])
        self._ys, y_leaves = Structure.of("y", np.zeros(n, np.int32) if y is None else y)
        names = self._xs.names + self._ys.names
        for name, a in zip(names[1:], x_leaves[1:] + y_leaves, strict=True):
            if a.ndim < 1 or len(a) != n:
                rows = len(a) if a.ndim else "no"
                hint = (
                    " (a list of arrays is one array, its first axis the samples; for several "
                    "inputs pass a tuple or a dict)"
                    if isinstance(x, list) and all(hasattr(item, "shape") for item in x)
                    else ""
                )
                raise DataError(f"{names[0]} has {n} samples but {name} has {rows}{hint}")
        self._leaves = [_leaf(name, a, label=False) for name, a in zip(self._xs.names, x_leaves)]
        self._leaves += [_leaf(name, a, label=True) for name, a in zip(self._ys.names, y_leaves)]
        self.sample_weight = None if sample_weight is None else _weights(sample_weight, n)
        if self.sample_weight is not None:
            self._leaves.append(self.sample_weight)
        self.x = self._xs.unflatten(self._leaves[: len(self._xs)])
        self.y = self._ys.unflatten(self._leaves[len(self._xs) : len(self._xs) + len(self._ys)])
        self.scale = scale
        self.class_names = plain_names(class_names)
        refuse_random_crop(augment, "Arrays")
        if augment is not None and self._xs.structured:
            raise ValueError("Arrays: augment= applies to a single image array x, not to a dict or tuple")
        self.augment = augment

    @property
    def num_samples(self) -> int:
        return len(self._leaves[0])

    @property
    def num_feeds(self) -> int:
        return len(self._leaves)

    @property
    def outputs(self) -> tuple[str, ...]:
        names = self._xs.names + self._ys.names
        return tuple(names + (["sample_weight"] if self.sample_weight is not None else []))

    def assemble(self, outputs: Sequence[Any]) -> dict[str, Any]:
        nx, ny = len(self._xs), len(self._ys)
        batch = {"x": self._xs.unflatten(outputs[:nx]), "y": self._ys.unflatten(outputs[nx : nx + ny])}
        if self.sample_weight is not None:
            batch["sample_weight"] = outputs[nx + ny]
        return batch

    @property
    def label_dtype(self) -> np.dtype:
        return self.y.dtype if not self._ys.structured else np.dtype(object)

    @property
    def sample_nbytes(self) -> int:
        return sum(a[0].nbytes for a in self._leaves)

    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        return [a[indices] for a in self._leaves]

    def known_labels(self) -> Any:
        return self.y

    def locate(self, index: int) -> str:
        return f"x[{index}]"

    def graph(self, *nodes: Any, device: str, draws: dict[str, Any] | None = None) -> tuple[Any, ...]:
        x, *rest = nodes  # as feed() returns them
        if not self._xs.structured and self._leaves[0].ndim == 4:
            from nvidia.dali import fn  # images: name the layout for DALI's image operators

            x = fn.reshape(x, layout="HWC")
        if self.images is not None:
            x = self.images.prepare(x)
        if draws is not None:
            x = apply_drawn(self.augment, x, draws)
        if device == "gpu":
            return tuple(node.gpu() for node in (x, *rest))
        return (x, *rest)

    def recipe(self) -> dict[str, Any]:
        """The recipe (``Source.recipe``) with the structure of the inputs: their names, one
        sample's shape and the dtype of each array; ``images`` when prepared as images."""
        names = self._xs.names
        inputs = {
            "structure": self._xs.kind,
            "keys": list(self._xs.keys),
            "names": names,
            "shapes": [list(a.shape[1:]) for a in self._leaves[: len(names)]],
            "dtypes": [str(a.dtype) for a in self._leaves[: len(names)]],
        }
        images = None if self.images is None else self.images.to_json()
        return {**super().recipe(), "images": images, "inputs": inputs}

    @classmethod
    def prepared(
        cls,
        recipe: Mapping[str, Any] | None,
        x: Any,
        y: Any = None,
        *,
        sample_weight: Any = None,
    ) -> Arrays:
        """Arrays read as a trained model's ``recipe`` says: after training on images, one
        uint8 array of images is prepared as the image files were (``images=``), while float
        arrays are taken as already-prepared inputs (no scale, no normalisation); after
        training on arrays, the same ``scale``. No recipe: Keras' way, as they are."""
        if recipe is None:
            return cls(x, y, sample_weight=sample_weight)
        if recipe.get("images"):
            images = ImageRecipe.from_json(recipe["images"])
            single = hasattr(x, "__array__") and not isinstance(x, (dict, tuple, list))
            if single and np.asarray(x).dtype == np.uint8:
                return cls(x, y, sample_weight=sample_weight, images=images)
            shape: tuple[int, ...] = tuple(np.shape(x)) if single else ()
            if len(shape) == 4 and shape[3] != images.channels:
                raise DataError(
                    f"x: inputs of shape {tuple(shape)}, but the model was trained on "
                    f"{images.color_mode} images (n, {', '.join(map(str, images.shape))}); "
                    "give inputs with that many channels"
                )
            return cls(x, y, sample_weight=sample_weight, scale=None)
        return cls(x, y, sample_weight=sample_weight, scale=recipe.get("scale"))

    def describe(self) -> str:
        parts = [f"{name}{tuple(a.shape)} {a.dtype}" for name, a in zip(self.outputs, self._leaves)]
        return f"Arrays({', '.join(parts)})"


def unscaled_note(source: Any) -> str | None:
    """A sentence for training data that is one integer array ``x`` (pixels, say) with values
    above 1 and no ``scale``: the model sees them as they are (Keras does too), which with
    uint8 images starts the loss far above a scaled run's; None for any other data.

    Example:
        >>> import numpy as np, easyfit as ef
        >>> from easyfit.data.sources.arrays import unscaled_note
        >>> x = np.full((4, 2, 2, 1), 255, np.uint8)
        >>> print(unscaled_note(ef.data.Arrays(x, np.arange(4))))
        x is uint8 with values up to 255 and no scale: the model sees them as they are ...
        >>> unscaled_note(ef.data.Arrays(x, np.arange(4), scale=1 / 255)) is None
        True
    """
    source = base_of(source)
    if not isinstance(source, Arrays) or source.scale is not None or source.images is not None:
        return None
    x = source.x
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "iu" or x.size == 0:
        return None
    top = int(np.max(x[:1024]))  # the first rows tell: reading all of a large memmap would not pay
    if top <= 1:
        return None
    return (
        f"x is {x.dtype} with values up to {top} and no scale: the model sees them as they are "
        "(as in Keras); for pixels in [0, 1] pass ef.data.Arrays(x, y, scale=1/255) to fit "
        "(scaled on the device, x kept uint8)"
    )
