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

__all__ = ["INTERPOLATIONS", "VERSION", "ImageRecipe", "check_interpolation"]

#: The recipe's format version (``recipe["version"]``).
VERSION = 1

#: The resize filters DALI's ``fn.resize`` has (on the CPU and the GPU), by Keras' names
#: (``image_dataset_from_directory(interpolation=)``), and the ``DALIInterpType`` of each.
#: Resizing is antialiased with each, as PIL's and torchvision's are.
INTERPOLATIONS = {
    "bilinear": "INTERP_LINEAR",
    "bicubic": "INTERP_CUBIC",
    "nearest": "INTERP_NN",
    "lanczos3": "INTERP_LANCZOS3",
    "gaussian": "INTERP_GAUSSIAN",
}


def check_interpolation(name: Any) -> str:
    """``name`` when DALI's resize has that filter; ValueError naming it otherwise (Keras'
    ``"area"``, ``"lanczos5"`` and ``"mitchellcubic"``, PIL's box and Hamming filters)."""
    if name not in INTERPOLATIONS:
        raise ValueError(
            f"interpolation={name!r}: DALI's resize has no such filter; give one of "
            f"{', '.join(map(repr, INTERPOLATIONS))} (for pretrained weights whose preprocessing "
            "names it: ImageFolder(path, **pre.image_folder_kwargs(interpolation='bicubic')))"
        )
    return str(name)


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
        eval_crop: the image is resized, keeping its aspect ratio, to the least size that covers
            ``image_size / eval_crop`` (for a square ``image_size``: its shorter side to
            ``round(size / eval_crop)``) and the center ``image_size`` taken; None: no crop.
        aspect: how an image of another aspect ratio than ``image_size`` is resized:
            ``"stretch"`` (to ``image_size``, distorted), ``"crop"`` (Keras'
            ``crop_to_aspect_ratio``: resized to cover ``image_size``, the center taken) or
            ``"pad"`` (Keras' ``pad_to_aspect_ratio``: resized to fit in ``image_size``, padded
            with zeros around the center).
        interpolation: the resize filter (:data:`INTERPOLATIONS`): ``"bilinear"`` (default),
            or the one pretrained weights were trained with (``"bicubic"`` for most of timm's).
    """

    image_size: tuple[int, int]
    resize: bool
    color_mode: str
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    eval_crop: float | None = None
    aspect: str = "stretch"
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        check_interpolation(self.interpolation)

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
    def cover(self) -> tuple[int, int] | None:
        """``(height, width)`` an image is resized to cover, keeping its aspect ratio, before
        the center ``image_size`` is taken; None without a center crop."""
        if self.eval_crop is None and self.aspect != "crop":
            return None
        fraction = self.eval_crop or 1.0
        h, w = self.image_size
        return round(h / fraction), round(w / fraction)

    @property
    def resize_shorter(self) -> int | None:
        """The shorter side before the center crop of a square ``image_size`` (the longer one
        in proportion), or None (no center crop, or a non-square one: see :attr:`cover`)."""
        cover = self.cover
        return cover[0] if cover is not None and cover[0] == cover[1] else None

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
            "cover": None if self.cover is None else list(self.cover),
            "aspect": self.aspect,
            "interpolation": self.interpolation,
            "scale": self.scale,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ImageRecipe:
        mean, std = data.get("mean"), data.get("std")
        normalize = None if mean is None or std is None else (tuple(mean), tuple(std))
        h, w = data["image_size"]
        return cls(
            (int(h), int(w)),
            bool(data["resize"]),
            str(data["color_mode"]),
            normalize,
            data.get("eval_crop"),
            str(data.get("aspect", "stretch")),  # recipes written before it: stretched
            str(data.get("interpolation", "bilinear")),  # and resized bilinearly
        )

    def settings(self) -> dict[str, Any]:
        """The keyword arguments of an image source that give this recipe."""
        settings: dict[str, Any] = {
            "image_size": self.image_size if self.resize else None,
            "color_mode": self.color_mode,
            "normalize": self.normalize,
            "eval_crop": self.eval_crop,
        }
        if self.aspect != "stretch":  # only the sources that take it are given it
            settings[f"{self.aspect}_to_aspect_ratio"] = True
        if self.interpolation != "bilinear":
            settings["interpolation"] = self.interpolation
        return settings

    def steps(self) -> str:
        """What a server must do to an image before the exported function (in words)."""
        h, w = self.image_size
        mode = "grayscale (1 channel)" if self.channels == 1 else "RGB (3 channels)"
        f = self.interpolation
        if self.resize_shorter is not None:
            geometry = f"resize the shorter side to {self.resize_shorter} ({f}), take the center {h}x{w}"
        elif self.cover is not None:
            ch, cw = self.cover
            geometry = (
                f"resize keeping the aspect ratio to the least size that covers {ch}x{cw} "
                f"({f}), take the center {h}x{w}"
            )
        elif self.aspect == "pad":
            geometry = (
                f"resize keeping the aspect ratio to the largest size within {h}x{w} ({f}), "
                f"pad with zeros around the center to {h}x{w}"
            )
        elif self.resize:
            geometry = f"resize to {h}x{w} ({f})"
        else:
            geometry = f"images must be {h}x{w} (the model never saw another size)"
        return f"decode as {mode} uint8; {geometry}; stack NHWC uint8"

    def prepare(self, images: Any, transform: Callable[[Any], Any] | None = None) -> Any:
        """DALI graph: decoded HWC uint8 images -> the model's inputs, as evaluation prepares
        them: the resize (and center crop), ``transform``, then the normalisation (float16) when
        there is one, else uint8."""
        from nvidia.dali import fn, types

        center = self.cover is not None
        images = self.resized(images)
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

    def resized(self, images: Any, **options: Any) -> Any:
        """DALI graph: decoded HWC uint8 images resized as this recipe says (``options``: more
        arguments of ``fn.resize``, such as nearest-neighbour sampling for masks). With a center
        crop (:attr:`cover`) the images are left larger than ``image_size``: the caller takes
        the center (alone, or fused into a normalisation)."""
        from nvidia.dali import fn, types

        u8 = types.DALIDataType.UINT8
        options = {**self.resize_options(), **options}
        cover = self.cover
        if cover is not None and cover[0] == cover[1]:
            return fn.resize(images, resize_shorter=cover[0], dtype=u8, **options)
        if cover is not None:
            return fn.resize(images, size=list(cover), mode="not_smaller", dtype=u8, **options)
        if self.aspect == "pad":
            images = fn.resize(images, size=list(self.image_size), mode="not_larger", dtype=u8, **options)
            return fn.crop(images, crop=list(self.image_size), out_of_bounds_policy="pad", fill_values=0)
        if self.resize:
            return fn.resize(images, size=list(self.image_size), dtype=u8, **options)
        return images

    def resize_options(self) -> dict[str, Any]:
        """``fn.resize``'s arguments for :attr:`interpolation` (none for bilinear, DALI's
        default)."""
        if self.interpolation == "bilinear":
            return {}
        from nvidia.dali import types

        return {"interp_type": getattr(types.DALIInterpType, INTERPOLATIONS[self.interpolation])}

    def check_array(self, shape: tuple[int, ...], name: str = "x") -> None:
        """DataError unless uint8 images of ``shape`` (NHWC) can be prepared by this recipe."""
        expected = f"(n, {', '.join(map(str, self.shape))})"
        one = len(shape) == 3 and shape[2] == self.channels
        if one and (tuple(shape[:2]) == self.image_size or self.resize):
            trained = (
                "of the trained shape" if tuple(shape[:2]) == self.image_size else "(resized as in training)"
            )
            raise DataError(
                f"{name} has shape {tuple(shape)}, one image {trained}: add the batch axis, "
                f"{name}[None] (an array's first axis counts the images)"
            )
        if self.channels == 1 and tuple(shape) == self.image_size:
            raise DataError(
                f"{name} has shape {tuple(shape)}, one grayscale image of the trained size: add the "
                f"batch and channel axes, {name}[None, ..., None]"
            )
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
