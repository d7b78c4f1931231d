"""The evaluation-time input recipe of a source: how its samples become the model's inputs.

A trained model is only right for inputs prepared as its training data's were: the same image
size, colour mode, center crop, scale and normalisation. Each source describes that recipe as
plain JSON (``Source.recipe()``); checkpoints record it beside the arrays, ``Trainer.load``
restores it, and a source of any kind is rebuilt from it (``Source.from_recipe``), so that
evaluation and prediction after a load read data exactly as the trainer that trained did.

:class:`ImageRecipe` is the part for images: it turns decoded HWC uint8 images (DALI nodes)
into what the model receives, as evaluation does, and says in words what a server must do.

Example:
    >>> from easyfit.data.recipe import ImageRecipe
    >>> r = ImageRecipe((224, 224), resize=True, color_mode="rgb",
    ...                 normalize=((0.5,) * 3, (0.25,) * 3), eval_crop=0.875)
    >>> r.resize_shorter, r.shape, r.scale
    (256, (224, 224, 3), None)
    >>> ImageRecipe.from_json(r.to_json()) == r
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import DataError

__all__ = ["VERSION", "ImageRecipe"]

#: The recipe's format version (``recipe["version"]``).
VERSION = 1


@dataclasses.dataclass(frozen=True)
class ImageRecipe:
    """How evaluation prepares decoded images.

    Attributes:
        image_size: ``(height, width)`` the model receives.
        resize: whether images are resized (``image_size=`` was given); False: every image
            already had ``image_size``, and images of another size cannot be taken.
        color_mode: ``"grayscale"`` or ``"rgb"``.
        normalize: ``(mean, std)`` per channel on the [0, 1] scale (the pixels then reach the
            model as float16 ``(x / 255 - mean) / std``), or None (uint8, scaled by 1/255 in
            the step).
        eval_crop: the shorter side is resized to ``round(max(image_size) / eval_crop)`` and the
            center ``image_size`` taken; None: a plain resize to ``image_size``.
    """

    image_size: tuple[int, int]
    resize: bool
    color_mode: str
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    eval_crop: float | None = None

    @property
    def channels(self) -> int:
        return 1 if self.color_mode == "grayscale" else 3

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(height, width, channels)`` of one prepared image."""
        return (*self.image_size, self.channels)

    @property
    def scale(self) -> float | None:
        """What the step multiplies the inputs by: 1/255, or None when they arrive normalised."""
        return None if self.normalize is not None else 1.0 / 255.0

    @property
    def resize_shorter(self) -> int | None:
        """The shorter side before the center crop, or None without one."""
        return None if self.eval_crop is None else round(max(self.image_size) / self.eval_crop)

    def to_json(self) -> dict[str, Any]:
        mean, std = self.normalize or (None, None)
        return {
            "image_size": list(self.image_size),
            "resize": self.resize,
            "color_mode": self.color_mode,
            "channels": self.channels,
            "mean": None if mean is None else list(mean),
            "std": None if std is None else list(std),
            "eval_crop": self.eval_crop,
            "resize_shorter": self.resize_shorter,
            "scale": self.scale,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ImageRecipe:
        mean, std = data.get("mean"), data.get("std")
        normalize = None if mean is None or std is None else (tuple(mean), tuple(std))
        h, w = data["image_size"]
        return cls(
            (int(h), int(w)), bool(data["resize"]), str(data["color_mode"]), normalize, data.get("eval_crop")
        )

    def settings(self) -> dict[str, Any]:
        """The keyword arguments of an image source that give this recipe."""
        return {
            "image_size": self.image_size if self.resize else None,
            "color_mode": self.color_mode,
            "normalize": self.normalize,
            "eval_crop": self.eval_crop,
        }

    def steps(self) -> str:
        """What a server must do to an image before the exported function (in words)."""
        h, w = self.image_size
        mode = "grayscale (1 channel)" if self.channels == 1 else "RGB (3 channels)"
        if self.eval_crop is not None:
            geometry = f"resize the shorter side to {self.resize_shorter} (bilinear), take the center {h}x{w}"
        elif self.resize:
            geometry = f"resize to {h}x{w} (bilinear)"
        else:
            geometry = f"images must be {h}x{w} (the model never saw another size)"
        return f"decode as {mode} uint8; {geometry}; stack NHWC uint8"

    def prepare(self, images: Any, transform: Callable[[Any], Any] | None = None) -> Any:
        """DALI graph: decoded HWC uint8 images -> the model's inputs, as evaluation prepares
        them: the resize (and center crop), ``transform``, then the normalisation (float16) when
        there is one, else uint8."""
        from nvidia.dali import fn, types

        center = self.eval_crop is not None
        if center:
            images = fn.resize(images, resize_shorter=self.resize_shorter, dtype=types.DALIDataType.UINT8)
        elif self.resize:
            images = fn.resize(images, size=list(self.image_size), dtype=types.DALIDataType.UINT8)
        if transform is not None:
            images = transform(images)
        if self.normalize is not None:
            mean, std = self.normalize
            crop: dict[str, Any] = {"crop": list(self.image_size)} if center else {}
            return fn.crop_mirror_normalize(
                images,
                dtype=types.DALIDataType.FLOAT16,
                mean=[255 * m for m in mean],
                std=[255 * s for s in std],
                output_layout="HWC",
                **crop,
            )
        if center:
            return fn.crop(images, crop=list(self.image_size))
        return images

    def check_array(self, shape: tuple[int, ...], name: str = "x") -> None:
        """DataError unless uint8 images of ``shape`` (NHWC) can be prepared by this recipe."""
        expected = f"(n, {', '.join(map(str, self.shape))})"
        if len(shape) != 4 or shape[3] != self.channels:
            raise DataError(
                f"{name}: uint8 images of shape {tuple(shape)}, but the model was trained on "
                f"{self.color_mode} images {expected}; give images of that shape"
            )
        if not self.resize and tuple(shape[1:3]) != self.image_size:
            raise DataError(
                f"{name}: images of {shape[1]}x{shape[2]}, but the model was trained on images "
                f"of {expected} that were never resized; resize them to that shape"
            )
