"""Segmentation folders: ``root/images/<name>.<ext>`` and ``root/masks/<name>.png``, decoded by
DALI with the same geometry for both."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import DataError
from ..augment import Augment
from ..images import EncodedImages, ImageSettings
from ..storage import Listing
from ..validation.samples import mask_problem
from .base import plain_names
from .folder import IMAGE_EXTENSIONS, Files, entries
from .registry import LAYOUT, Format, register

__all__ = ["SegmentationFolder", "mask_problem", "pair_files"]


def _stems(folder: str, extensions: tuple[str, ...]) -> dict[str, str]:
    """``{file name without extension: path}`` of the files in ``folder`` with ``extensions``;
    DataError naming two files of one name."""
    if not os.path.isdir(folder):
        raise DataError(f"{folder}: no such directory")
    found: dict[str, str] = {}
    for entry in sorted(entries(folder), key=lambda e: e.name):
        stem, ext = os.path.splitext(entry.name)
        if entry.name.startswith(".") or ext.lower() not in extensions:
            continue
        if stem in found:
            raise DataError(
                f"{entry.path}: the same name as {found[stem]} (images and masks are matched by "
                "name without extension); keep one"
            )
        found[stem] = entry.path
    return found


def pair_files(images: str, masks: str) -> tuple[list[str], list[str]]:
    """``(images, masks)``: the images of folder ``images`` and their masks in ``masks``
    (``<name>.png``), sorted by name; DataError naming an image without a mask or a mask
    without an image."""
    by_stem = _stems(images, IMAGE_EXTENSIONS)
    mask_by_stem = _stems(masks, (".png",))
    if not by_stem:
        raise DataError(f"{images}: no images (extensions looked for: {', '.join(IMAGE_EXTENSIONS)})")
    for what, have, partner, where in (
        ("no mask", by_stem, mask_by_stem, masks),
        ("no image", mask_by_stem, by_stem, images),
    ):
        alone = sorted(set(have) - set(partner))
        if alone:
            more = f" (and {len(alone) - 1} more)" if len(alone) > 1 else ""
            expected = os.path.join(where, alone[0] + ".png") if what == "no mask" else where
            raise DataError(f"{have[alone[0]]}: {what} of that name ({expected} expected){more}")
    stems = sorted(by_stem)
    return [by_stem[s] for s in stems], [mask_by_stem[s] for s in stems]


class SegmentationFolder(EncodedImages, Files):
    """Images and their segmentation masks: ``root/images/<name>.<ext>`` and
    ``root/masks/<name>.png``, matched by file name (without the extension)::

        root/
          images/
            0001.jpg        # JPEG, PNG, BMP, WebP, ... as for ImageFolder
            ...
          masks/
            0001.png        # 8-bit grayscale PNG, the image's size: a class id per pixel
            ...

    Both are read in easyfit's order and decoded by DALI. Samples reach the model as the
    images of :class:`~easyfit.data.ImageFolder` (NHWC float32 in [0, 1], or normalised), with
    labels ``y`` of shape ``(H, W)``, int32: the class id of each pixel. The loss inferred for
    them is the sparse categorical cross-entropy of each pixel, averaged per image, and the
    accuracy is that of the pixels: the model outputs ``(H, W, classes)`` logits. ``predict``
    returns those per-pixel outputs.

    Every random draw of ``augment`` (an :class:`~easyfit.data.Augment`) applies to an image
    and its mask alike: the same random crop, padded crop, flip and rotation; brightness and
    contrast change the image only. Masks are resized and rotated by nearest neighbour, never
    blending class ids, and never normalised. Padding and the corners of a rotation are class 0.

    An image without a mask (or a mask without an image) raises DataError naming it; so does a
    mask that is not an 8-bit grayscale PNG of its image's size, the first time it is read.
    Class ids outside the model's outputs are named from the first batch.

    Args:
        root: the folder holding ``images/`` and ``masks/``.
        image_size: ``(height, width)`` to resize images and masks to; None infers it from the
            images, which must then all share one size.
        color_mode: of the images: ``"grayscale"``, ``"rgb"``, or None to infer it.
        decoder: where images are decoded on a GPU (as for ImageFolder); masks are decoded on
            the CPU.
        augment: an ``easyfit.data.Augment`` for training batches (a plain function could not
            apply its draws to the masks).
        normalize: ``"imagenet"`` or ``(mean, std)``, as for ImageFolder (images only).
        eval_crop: as for ImageFolder; the masks are cropped alike.
        class_names: optional names of the class ids, in order (``trainer.class_names``).
        images: the name of the images' sub-folder.
        masks: the name of the masks' sub-folder.

    Example:
        >>> import numpy as np, os, tempfile, easyfit as ef
        >>> tmp = tempfile.mkdtemp()
        >>> for d in ("images", "masks"):
        ...     os.makedirs(f"{tmp}/seg/{d}")
        >>> for i in range(4):
        ...     ef.datasets.write_png(f"{tmp}/seg/images/{i}.png", np.full((8, 6, 3), 40 * i, np.uint8))
        ...     ef.datasets.write_png(f"{tmp}/seg/masks/{i}.png", np.full((8, 6), i % 2, np.uint8))
        >>> data = ef.data.SegmentationFolder(tmp + "/seg")
        >>> len(data), data.image_shape, data.mask_shape
        (4, (8, 6, 3), (8, 6))
    """

    sample_check = "segmentation"
    _mask_limit: int | None = None

    def __init__(
        self,
        root: str | os.PathLike,
        image_size: tuple[int, int] | None = None,
        color_mode: str | None = None,
        decoder: str = "auto",
        augment: Augment | None = None,
        normalize: Any = None,
        eval_crop: float | None = None,
        class_names: Sequence[str] | None = None,
        images: str = "images",
        masks: str = "masks",
    ):
        if augment is not None and not isinstance(augment, Augment):
            raise ValueError(
                "augment: SegmentationFolder takes an easyfit.data.Augment, whose random draws "
                "apply to the masks too (a plain function would move the images alone)"
            )
        self.root = os.fspath(root)
        if not os.path.isdir(self.root):
            raise DataError(f"{self.root}: no such directory")
        self.folders = (images, masks)
        self.files, self.masks = pair_files(os.path.join(self.root, images), os.path.join(self.root, masks))
        Files.__init__(self, self.files, self.masks)
        self.class_names = plain_names(class_names)
        settings = ImageSettings(image_size, color_mode, decoder, None, augment, normalize, eval_crop)
        EncodedImages.__init__(self, settings, self.sampled, self.root)

    @property
    def mask_shape(self) -> tuple[int, int]:
        """``(height, width)`` of the labels ``y`` the model is trained against."""
        return self.image_size

    @property
    def num_feeds(self) -> int:
        return 4

    @property
    def sample_nbytes(self) -> int:
        return super().sample_nbytes - 4 + 4 * self.image_size[0] * self.image_size[1]

    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        return self.feed_paths(indices)  # image paths and lengths, mask paths and lengths

    def graph(self, *nodes: Any, device: str, draws: dict[str, Any] | None = None) -> tuple[Any, Any]:
        from nvidia.dali import fn, types

        paths, lengths, mask_paths, mask_lengths = nodes  # as feed() returns them
        images = self.decode(self.read(paths, lengths), device=device, draws=draws)
        masks = self.decode(self.read(mask_paths, mask_lengths), device=device, draws=draws, mask=True)
        masks = fn.cast(fn.squeeze(masks, axis_names="C"), dtype=types.DALIDataType.INT32)
        return images, masks

    def limit_labels(self, num_classes: int) -> None:
        self._mask_limit = num_classes  # class ids are decoded by DALI: checked per batch

    def decoded_label_limit(self) -> int | None:
        return self._mask_limit

    def sibling(self, path: str | os.PathLike) -> SegmentationFolder:
        settings = self.image_settings()
        del settings["transform"]
        images, masks = self.folders
        other = SegmentationFolder(path, **settings, class_names=self.class_names, images=images, masks=masks)
        self.check_same_images(other, self.root, other.root)
        return other

    def describe(self) -> str:
        return f"SegmentationFolder({self.root!r}: {self.num_samples} images with masks)"


def _images_and_masks(listing: Listing) -> bool:
    """Whether a folder holds exactly the sub-folders ``images/`` and ``masks/``."""
    return {e.name for e in listing.dirs if not e.name.startswith(".")} == {"images", "masks"}


register(Format("segmentation", SegmentationFolder, _images_and_masks, priority=LAYOUT))
