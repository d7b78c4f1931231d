"""Training-time augmentation on the DALI side."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Augment"]


@dataclasses.dataclass(frozen=True)
class Augment:
    """Random image augmentation for training batches, run by DALI (CPU or GPU).

    Pass it as a source's ``augment=`` (``ImageFolder(root, augment=Augment())``): the loader
    applies it to training batches only, never to evaluation or prediction. Each operation draws
    from DALI's random generators, seeded by the Trainer's seed, so a seed reproduces the same
    augmented batches. The input is a batch of HWC uint8 images of one size; the output has the
    same size and dtype. Operations run in this order; 0 or False leaves one out.

    Args:
        crop_padding: pad each side by this many pixels (zeros), then crop back to the original
            size at a random offset (the CIFAR "random crop with padding").
        flip: random horizontal flip (probability 1/2).
        rotation: random rotation by up to this many degrees either way (corners filled with 0).
        brightness: multiply by a random factor in ``[1 - brightness, 1 + brightness]``.
        contrast: scale the distance from mid-grey by a random factor in
            ``[1 - contrast, 1 + contrast]``.

    A user function on DALI nodes works the same way: ``augment=lambda x: fn.flip(x,
    horizontal=0, vertical=fn.random.coin_flip())``, or a composition with this one.

    Example:
        >>> import easyfit as ef
        >>> from flax import linen as nn
        >>> root = ef.datasets.sample_folder(DOCS_TMP + "/mnist", limit=(200, 100))
        >>> aug = ef.data.Augment(crop_padding=2, flip=False, rotation=10)
        >>> train = ef.data.ImageFolder(root + "/train", augment=aug)
        >>> model = nn.Sequential([lambda x: x.reshape((x.shape[0], -1)), nn.Dense(10)])
        >>> history = ef.Trainer(model).fit(train, validation_data=root + "/val", verbose=0)
        >>> sorted(history.history)
        ['accuracy', 'loss', 'val_accuracy', 'val_loss']
    """

    crop_padding: int = 0
    flip: bool = True
    rotation: float = 0.0
    brightness: float = 0.0
    contrast: float = 0.0

    def __post_init__(self):
        if self.crop_padding < 0 or self.rotation < 0:
            raise ValueError(f"{self}: crop_padding and rotation must be >= 0")
        for name in ("brightness", "contrast"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"Augment({name}={getattr(self, name)}): expected a value in "
                                 "[0, 1)")

    def __call__(self, images: Any) -> Any:
        from nvidia.dali import fn, types

        if self.crop_padding:
            p = int(self.crop_padding)
            offset = fn.random.uniform(values=list(range(-p, p + 1)), shape=[2],
                                       dtype=types.DALIDataType.INT32)
            images = fn.slice(images, start=offset,
                              shape=images.shape(dtype=types.DALIDataType.INT32)[0:2],
                              axis_names="HW", out_of_bounds_policy="pad", fill_values=0)
        if self.flip:
            images = fn.flip(images, horizontal=fn.random.coin_flip())
        if self.rotation:
            r = float(self.rotation)
            images = fn.rotate(images, angle=fn.random.uniform(range=[-r, r]), keep_size=True,
                               fill_value=0)
        if self.brightness or self.contrast:
            b, c = float(self.brightness), float(self.contrast)
            images = fn.brightness_contrast(
                images, brightness=fn.random.uniform(range=[1 - b, 1 + b]),
                contrast=fn.random.uniform(range=[1 - c, 1 + c]), dtype=types.DALIDataType.UINT8)
        return images
