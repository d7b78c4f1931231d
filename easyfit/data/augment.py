"""Training-time augmentation on the DALI side, with randomness that resumes exactly.

Every random number an :class:`Augment` uses is a *draw*: per sample, a pure function of the
Trainer's seed, the data pass (the epoch, unless fit is given ``steps_per_epoch``) and the
sample's index (:meth:`Augment.sample`, a counter-based hash computed on the host and fed to
DALI with the sample). So every pipeline, device and process draws its own numbers, the same
sample gets the same crop whatever the number of devices, and a resumed run draws what the run
never stopped drew. Sources read by DALI's own readers, which pick the order themselves, draw
with DALI's random operators instead (:meth:`Augment.dali_draws`), seeded per reader shard and
resumed by DALI's checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

__all__ = ["Augment", "apply_drawn", "refuse_random_crop", "uniforms"]

_M = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of uint64 that scatters every input bit."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def uniforms(seed: int, epoch: int, indices: np.ndarray, count: int) -> np.ndarray:
    """``(len(indices), count)`` uniform numbers in [0, 1), one row per sample: a pure function
    of (seed, epoch, sample index, column).

    Example:
        >>> import numpy as np
        >>> from easyfit.data.augment import uniforms
        >>> a = uniforms(0, 1, np.array([5, 9]), 3)
        >>> a.shape, bool((a >= 0).all() and (a < 1).all())
        ((2, 3), True)
        >>> np.array_equal(a[1], uniforms(0, 1, np.array([9]), 3)[0])  # per sample, not per batch
        True
    """
    with np.errstate(over="ignore"):
        key = _mix(np.uint64(seed & int(_M)) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(epoch & int(_M)))
        x = _mix(key ^ (np.asarray(indices, np.uint64) * np.uint64(0xD1B54A32D192ED03)))
        cols = np.arange(1, count + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        bits = _mix(x[:, None] + cols[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def apply_drawn(augment: Any, images: Any, draws: dict[str, Any]) -> Any:
    """``augment``'s operations on decoded images with the given draws (``augment`` is the
    source's Augment: draws are passed only then)."""
    assert isinstance(augment, Augment)
    return augment.after_decode(images, draws)


def refuse_random_crop(augment: Any, where: str) -> None:
    """ValueError when ``augment`` crops at random: the crop is part of decoding (its window
    comes from the decoded image), so it needs encoded images (JPEG, PNG, ...), not arrays."""
    if getattr(augment, "random_resized_crop", None):
        raise ValueError(
            f"{where}: augment=Augment(random_resized_crop=...) applies to encoded "
            "images (it is decoded into the crop); use crop_padding for arrays"
        )


@dataclasses.dataclass(frozen=True)
class Augment:
    """Random image augmentation for training batches, run by DALI (CPU or GPU).

    Pass it as a source's ``augment=`` (``ImageFolder(root, augment=Augment())``): the loader
    applies it to training batches only, never to evaluation or prediction. The randomness is a
    function of the Trainer's seed, the epoch and the sample (see the module's text): a seed
    reproduces the same augmented batches, on any number of devices, and a run resumed from a
    backup draws exactly what a run never stopped draws. Operations run in this order; 0, False
    or None leaves one out.

    Args:
        random_resized_crop: ``(min, max)`` fraction of the image's area to crop at random
            (torchvision's ``RandomResizedCrop(scale=...)``; ImageNet training uses
            ``(0.08, 1.0)``), with an aspect ratio drawn log-uniformly in ``aspect_ratio``; the
            window is then resized to the source's ``image_size``. For encoded images the window
            is sliced from the decoded image (on GPUs decoded by nvJPEG), its size from the
            decoded shape. Needs ``image_size``; evaluation then resizes the shorter side to
            ``image_size / 0.875`` and takes the center (the source's ``eval_crop``).
        aspect_ratio: ``(min, max)`` width/height ratio of the random crop.
        crop_padding: pad each side by this many pixels (zeros), then crop back to the original
            size at a random offset (the CIFAR "random crop with padding").
        flip: random horizontal flip (probability 1/2).
        rotation: random rotation by up to this many degrees either way (corners filled with 0).
        brightness: multiply by a random factor in ``[1 - brightness, 1 + brightness]``.
        contrast: scale the distance from mid-grey by a random factor in
            ``[1 - contrast, 1 + contrast]``.

    A user function on DALI nodes works as ``augment=`` too: ``augment=lambda x: fn.flip(x,
    horizontal=0, vertical=fn.random.coin_flip())``; it draws from DALI's own generators (each
    pipeline seeded apart), so a resumed run does not repeat its draws exactly.

    Example:
        >>> import tempfile, easyfit as ef
        >>> tmp = tempfile.mkdtemp()
        >>> from flax import linen as nn
        >>> root = ef.datasets.sample_folder(tmp + "/mnist", limit=(200, 100))
        >>> aug = ef.data.Augment(crop_padding=2, flip=False, rotation=10)
        >>> train = ef.data.ImageFolder(root + "/train", augment=aug)
        >>> model = nn.Sequential([lambda x: x.reshape((x.shape[0], -1)), nn.Dense(10)])
        >>> history = ef.Trainer(model).fit(train, validation_data=root + "/val", verbose=0)
        >>> sorted(history.history)
        ['accuracy', 'input_wait', 'loss', 'val_accuracy', 'val_loss']
    """

    random_resized_crop: tuple[float, float] | None = None
    aspect_ratio: tuple[float, float] = (3 / 4, 4 / 3)
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
                raise ValueError(f"Augment({name}={getattr(self, name)}): expected a value in [0, 1)")
        for name, (lo, hi), top in (
            ("random_resized_crop", self.random_resized_crop or (1, 1), 1.0),
            ("aspect_ratio", self.aspect_ratio, math.inf),
        ):
            if not 0 < lo <= hi <= top:
                raise ValueError(
                    f"Augment({name}={getattr(self, name)}): expected (min, max) "
                    f"with 0 < min <= max{' <= 1' if top == 1 else ''}"
                )

    # ------------------------------------------------------------------------------- draws
    def names(self) -> list[str]:
        """The per-sample draws, in feed order."""
        names = []
        if self.random_resized_crop:
            names += ["area", "log_ratio", "crop_x", "crop_y"]
        if self.crop_padding:
            names += ["pad_y", "pad_x"]
        if self.flip:
            names += ["flip"]
        if self.rotation:
            names += ["angle"]
        if self.brightness or self.contrast:
            names += ["brightness", "contrast"]
        return names

    def _ranges(self) -> dict[str, tuple[float, float]]:
        lo, hi = self.random_resized_crop or (1.0, 1.0)
        p, r, b, c = float(self.crop_padding), float(self.rotation), self.brightness, self.contrast
        return {
            "area": (lo, hi),
            "log_ratio": (math.log(self.aspect_ratio[0]), math.log(self.aspect_ratio[1])),
            "crop_x": (0.0, 1.0),
            "crop_y": (0.0, 1.0),
            "pad_y": (-p, p + 1),
            "pad_x": (-p, p + 1),
            "angle": (-r, r),
            "brightness": (1 - b, 1 + b),
            "contrast": (1 - c, 1 + c),
        }

    def sample(self, seed: int, epoch: int, indices: np.ndarray) -> list[np.ndarray]:
        """The draws of samples ``indices`` in data pass ``epoch`` (one array per name, fed to
        DALI)."""
        names = self.names()
        u = uniforms(seed, epoch, indices, len(names))
        ranges = self._ranges()
        out = []
        for j, name in enumerate(names):
            if name == "flip":
                out.append((u[:, j] < 0.5).astype(np.int32))
            elif name.startswith("pad_"):
                lo, hi = ranges[name]
                out.append(np.floor(lo + u[:, j] * (hi - lo)).astype(np.int32))
            else:
                lo, hi = ranges[name]
                out.append((lo + u[:, j] * (hi - lo)).astype(np.float32))
        return out

    def dali_draws(self) -> dict[str, Any]:
        """The same draws from DALI's random operators (for sources read by DALI's readers)."""
        from nvidia.dali import fn, types

        ranges = self._ranges()
        draws = {}
        for name in self.names():
            if name == "flip":
                draws[name] = fn.random.coin_flip(dtype=types.DALIDataType.INT32)
            elif name.startswith("pad_"):
                p = int(self.crop_padding)
                draws[name] = fn.random.uniform(values=list(range(-p, p + 1)), dtype=types.DALIDataType.INT32)
            else:
                draws[name] = fn.random.uniform(range=list(ranges[name]))
        return draws

    # --------------------------------------------------------------------------- the graph
    @staticmethod
    def window(draws: dict[str, Any], shape: Any) -> tuple[Any, Any]:
        """The random crop as relative ``(start, size)`` in (y, x), from the draws and the
        images' ``(H, W, C)`` shape (a DALI node): ``area`` of the image at aspect ratio
        ``exp(log_ratio)``, clamped to fit, placed at ``(crop_y, crop_x)`` of the free room."""
        import nvidia.dali.math as dmath
        from nvidia.dali import fn, types

        shape = fn.cast(shape, dtype=types.DALIDataType.FLOAT)
        h, w = shape[0], shape[1]
        ratio = dmath.exp(draws["log_ratio"])
        rel_w = dmath.min(dmath.sqrt(draws["area"] * ratio * h / w), 1.0)
        rel_h = dmath.min(dmath.sqrt(draws["area"] * w / (ratio * h)), 1.0)
        start = fn.stack(draws["crop_y"] * (1.0 - rel_h), draws["crop_x"] * (1.0 - rel_w))
        return start, fn.stack(rel_h, rel_w)

    def after_decode(
        self, images: Any, draws: dict[str, Any], *, flip: bool = True, mask: bool = False
    ) -> Any:
        """The operations on decoded HWC uint8 images of one size: padded crop, flip (unless
        ``flip`` is False: a normalisation fuses it), rotation, brightness and contrast.

        ``mask=True``: the geometric operations alone, for the class-id maps (segmentation
        masks) of images augmented with the same draws: the rotation samples the nearest pixel,
        and padding is class 0."""
        from nvidia.dali import fn, types

        if self.crop_padding:
            offset = fn.stack(draws["pad_y"], draws["pad_x"])
            images = fn.slice(
                images,
                start=offset,
                shape=images.shape(dtype=types.DALIDataType.INT32)[0:2],
                axis_names="HW",
                out_of_bounds_policy="pad",
                fill_values=0,
            )
        if self.flip and flip:
            images = fn.flip(images, horizontal=draws["flip"])
        if self.rotation:
            interp = types.DALIInterpType.INTERP_NN if mask else types.DALIInterpType.INTERP_LINEAR
            images = fn.rotate(images, angle=draws["angle"], keep_size=True, fill_value=0, interp_type=interp)
        if (self.brightness or self.contrast) and not mask:
            images = fn.brightness_contrast(
                images,
                brightness=draws["brightness"],
                contrast=draws["contrast"],
                dtype=types.DALIDataType.UINT8,
            )
        return images

    def __call__(self, images: Any) -> Any:
        """The operations with DALI's own random draws (for use as a plain function)."""
        return self.after_decode(images, self.dali_draws())
