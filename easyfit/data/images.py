"""What every source of encoded images shares: settings, shape inference, the decode graph.

A source of encoded images (files, records of a RecordIO/TFRecord/WebDataset/LMDB) takes the
users' image settings as keyword arguments (:class:`ImageOptions`), makes them one
:class:`ImageSettings` and subclasses :class:`EncodedImages`: its ``__init__``, given a few
sampled images, sets ``color_mode``, ``image_size``, ``image_shape``, and
:meth:`EncodedImages.decode` turns DALI nodes of encoded bytes into HWC uint8 images of that
size and color mode.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict, cast

import numpy as np

from ..errors import DataError
from .recipe import ImageRecipe, check_interpolation
from .storage import storage_for
from .validation.encoded import HEAD, header_channels, image_kind, image_problem

__all__ = [
    "EncodedImages",
    "ImageOptions",
    "ImageSettings",
    "first_line",
    "peek_shapes",
    "stored_channels",
]

SAMPLED = 64  # images read to infer color mode and size
_SMALL_AREA = 128 * 128  # below this, CPU decoding beats the GPU's JPEG decoder (see docs)
#: Share of JPEG decoding given to the GPU's hardware decoder (nvJPEG's engine on A100, H100 and
#: H200) when decoding on the GPU; the rest runs on CUDA cores. Higher than DALI's default 0.65,
#: which leaves the engine short of work (the measurements: docs/performance.md).
HW_DECODER_LOAD = 0.9
#: ImageNet's per-channel mean and standard deviation, on the [0, 1] scale (RGB).
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
#: The fraction of the shorter side kept by evaluation's center crop after a random-crop training
#: (ImageNet's 224 of 256).
EVAL_CROP = 0.875


def normalization(normalize: Any, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """``normalize=`` as ``(mean, std)`` per channel on the [0, 1] scale, or None.

    Example:
        >>> from easyfit.data.images import normalization
        >>> normalization("imagenet", 3)[0]
        (0.485, 0.456, 0.406)
        >>> normalization((0.5, 0.25), 1)
        ((0.5,), (0.25,))
    """
    if normalize is None:
        return None
    if isinstance(normalize, str):
        if normalize != "imagenet":
            raise ValueError(f"normalize={normalize!r}: expected 'imagenet', (mean, std) or None")
        normalize = IMAGENET
    try:
        mean, std = (
            tuple(float(v) for v in np.broadcast_to(np.asarray(a, float), (channels,))) for a in normalize
        )
    except (TypeError, ValueError):
        raise ValueError(
            f"normalize={normalize!r}: expected 'imagenet', or (mean, std) with "
            f"one value or {channels} per channel, on the [0, 1] scale"
        ) from None
    if min(std) <= 0:
        raise ValueError(f"normalize={normalize!r}: std must be > 0")
    return mean, std


def first_line(e: BaseException) -> str:
    """The first non-empty line of an exception's message (DALI's are long)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("Critical error")] or lines
    return lines[0] if lines else type(e).__name__


def check_images(samples: Sequence[tuple[str, bytes]]) -> None:
    """Raises DataError naming the first encoded image ``(name, bytes)`` that is not a whole
    image (``validation.encoded.image_problem``)."""
    for name, encoded in samples:
        problem = image_problem(encoded)
        if problem:
            raise DataError(f"{name}: {problem}")


def stored_channels(samples: Sequence[tuple[str, bytes]]) -> list[int] | None:
    """The channels each encoded image ``(name, bytes)`` stores, from its header (JPEG, PNG),
    or None when a header does not tell them (:func:`peek_shapes` then asks DALI). Raises
    DataError naming the first sample that is not an image."""
    check_images(samples)
    channels = []
    for _, encoded in samples:
        kind = image_kind(encoded[:HEAD])
        count = header_channels(kind, encoded[:HEAD]) if kind is not None else None
        if count is None:
            return None
        channels.append(count)
    return channels


def peek_shapes(samples: Sequence[tuple[str, bytes]]) -> list[tuple[int, ...]]:
    """HWC shapes of encoded images ``(name, bytes)``, read from their headers by DALI.

    (``fn.peek_image_shape`` with ``ANY_DATA``: channels as stored; decoding grayscale JPEGs with
    ``ANY_DATA`` crashes DALI 2.4 on the CPU.) Raises DataError naming the first sample that is
    not an image.
    """
    from nvidia.dali import fn, pipeline_def, types

    check_images(samples)
    data = [np.frombuffer(b, np.uint8) for _, b in samples]

    # DALI's pipeline_def stub types device_id as int; its docs take None (CPU only)
    @pipeline_def(batch_size=len(data), num_threads=1, device_id=None, prefetch_queue_depth=1)  # type: ignore[call-overload]
    def peek():
        encoded = fn.external_source(source=lambda: data, batch=True, dtype=types.DALIDataType.UINT8)
        return fn.peek_image_shape(encoded, image_type=types.ANY_DATA)

    pipe = peek()
    pipe.build()
    try:
        (out,) = pipe.run()
    except RuntimeError as e:
        if len(samples) == 1:
            raise DataError(f"{samples[0][0]}: cannot be decoded as an image ({first_line(e)})") from None
        return [s for sample in samples for s in peek_shapes([sample])]
    finally:
        del pipe
    return [tuple(int(v) for v in out.at(i)) for i in range(len(data))]


#: EXIF orientations that turn an image by a quarter (height and width swap).
QUARTER_TURNS = (5, 6, 7, 8)


def exif_orientation(data: bytes) -> int | None:
    """The EXIF orientation (1 to 8) of a JPEG (its APP1 Exif segment's IFD0 tag 0x0112), or
    None. DALI's decoders apply it, as Pillow's ``ImageOps.exif_transpose`` does.

    Example:
        >>> from easyfit.data.images import exif_orientation
        >>> tiff = bytes.fromhex("4d4d002a 00000008 0001 0112 0003 00000001 0006 0000 00000000")
        >>> app1 = bytes.fromhex("ffe1") + (8 + len(tiff)).to_bytes(2, "big") + b"Exif" + bytes(2)
        >>> exif_orientation(bytes.fromhex("ffd8") + app1 + tiff + bytes.fromhex("ffd9"))
        6
    """
    i = 2 if data.startswith(b"\xff\xd8") else len(data)
    while i + 4 <= len(data) and data[i] == 0xFF and data[i + 1] not in (0xDA, 0xD9):
        if data[i + 1] == 0xE1 and data[i + 4 : i + 10] == b"Exif\0\0":
            tiff = i + 10
            order: Any = "little" if data[tiff : tiff + 2] == b"II" else "big"
            ifd = tiff + int.from_bytes(data[tiff + 4 : tiff + 8], order)
            for k in range(int.from_bytes(data[ifd : ifd + 2], order)):
                entry = ifd + 2 + 12 * k
                if int.from_bytes(data[entry : entry + 2], order) == 0x0112:
                    return int.from_bytes(data[entry + 8 : entry + 10], order)
            return None
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return None


def turned(data: bytes) -> str:
    """``" after its EXIF orientation 6 (a quarter turn, ...)"`` for an image that its EXIF
    orientation turns by a quarter, else ``""``: what explains height and width swapped."""
    orientation = exif_orientation(data)
    if orientation not in QUARTER_TURNS:
        return ""
    return (
        f" after its EXIF orientation {orientation} (a quarter turn, which DALI applies as "
        "Pillow's exif_transpose does)"
    )


def sample_positions(n: int, k: int = SAMPLED) -> np.ndarray:
    """Up to ``k`` evenly spread positions in ``range(n)``."""
    return np.unique(np.linspace(0, n - 1, min(k, n)).astype(int))


class ImageOptions(TypedDict, total=False):
    """The image settings a source of encoded images takes as keyword arguments
    (:class:`ImageSettings`' fields; see :class:`~easyfit.data.ImageFolder` for each)."""

    image_size: tuple[int, int] | None
    color_mode: str | None
    decoder: str
    transform: Callable[[Any], Any] | None
    augment: Callable[[Any], Any] | None
    normalize: Any
    eval_crop: float | None
    crop_to_aspect_ratio: bool
    pad_to_aspect_ratio: bool
    interpolation: str


@dataclasses.dataclass(frozen=True)
class ImageSettings:
    """How a source of encoded images prepares them, as its user gave it: one value shared by
    every image source, built from their keyword arguments (:class:`ImageOptions`) and checked
    once here. What is None (size, color mode) is inferred from the images by
    :class:`EncodedImages`; the arguments are :class:`~easyfit.data.ImageFolder`'s.

    Example:
        >>> from easyfit.data.images import ImageSettings
        >>> ImageSettings(image_size=[32, 24]).image_size
        (32, 24)
        >>> ImageSettings(decoder="gpu")
        Traceback (most recent call last):
        ...
        ValueError: decoder='gpu': expected 'auto', 'mixed' or 'cpu'
    """

    image_size: tuple[int, int] | None = None
    color_mode: str | None = None
    decoder: str = "auto"
    transform: Callable[[Any], Any] | None = None
    augment: Callable[[Any], Any] | None = None
    normalize: Any = None
    eval_crop: float | None = None
    crop_to_aspect_ratio: bool = False
    pad_to_aspect_ratio: bool = False
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        color_mode, decoder, image_size = self.color_mode, self.decoder, self.image_size
        check_interpolation(self.interpolation)
        if color_mode == "rgba":
            raise ValueError(
                "color_mode='rgba': DALI decodes images as grayscale or RGB, so easyfit does not "
                "read an alpha channel; give 'rgb', or images with alpha as arrays of shape "
                "(n, h, w, 4) or a NumpyFolder (see 'Image folders' in docs/keras.md)"
            )
        if color_mode not in (None, "grayscale", "rgb"):
            raise ValueError(f"color_mode={color_mode!r}: expected 'grayscale', 'rgb' or None")
        if decoder not in ("auto", "mixed", "cpu"):
            raise ValueError(f"decoder={decoder!r}: expected 'auto', 'mixed' or 'cpu'")
        if image_size is not None:
            if len(image_size) != 2 or min(image_size) < 1:
                raise ValueError(f"image_size={image_size!r}: expected (height, width)")
            object.__setattr__(self, "image_size", (int(image_size[0]), int(image_size[1])))
        if self.random_crop and image_size is None:
            raise ValueError(
                "augment: random_resized_crop needs image_size, the size the crops are resized to: "
                "ef.data.ImageFolder(path, image_size=(h, w), augment=...)"
            )

    @classmethod
    def of(cls, kind: str, options: Mapping[str, Any], without: Sequence[str] = ()) -> ImageSettings:
        """The settings of keyword arguments ``options`` given to source ``kind`` (its name);
        TypeError naming an argument that is not an image setting of that kind (one of
        ``without``), as Python names one."""
        taken = {f.name for f in dataclasses.fields(cls)} - set(without)
        unknown = sorted(set(options) - taken)
        if unknown:
            raise TypeError(f"{kind}() got an unexpected keyword argument {unknown[0]!r}")
        return cls(**options)

    @property
    def random_crop(self) -> bool:
        """Whether training crops at random (``Augment(random_resized_crop=...)``)."""
        return bool(getattr(self.augment, "random_resized_crop", None))


class EncodedImages:
    """The images of a source of encoded images, prepared as its :class:`ImageSettings` say:
    the settings inferred from a sample of its images, and the decode graph.

    A source calls ``EncodedImages.__init__`` from its own once it can sample its images.

    Args:
        settings: the user's settings.
        sample: gives ``(name, bytes)`` of a few images, what a setting left None is inferred
            from (called only then).
        where: the data's name, for messages.
    """

    color_mode: str
    image_size: tuple[int, int]
    resize: bool
    decoder: str
    transform: Callable[[Any], Any] | None
    augment: Callable[[Any], Any] | None
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    eval_crop: float | None = None
    aspect: str = "stretch"
    interpolation: str = "bilinear"
    scale: float | None = 1.0 / 255.0

    def __init__(
        self, settings: ImageSettings, sample: Callable[[], Sequence[tuple[str, bytes]]], where: str
    ) -> None:
        """Infers what is None from ``sample()``; checks the settings that depend on it.

        ``normalize``: images leave DALI normalised, as float16. ``eval_crop``: evaluation
        resizes the image, keeping its aspect ratio, to cover ``image_size / eval_crop`` and
        takes the center; default :data:`EVAL_CROP` when ``augment`` crops at random, else
        None (a plain resize to ``image_size``). ``crop_to_aspect_ratio`` and
        ``pad_to_aspect_ratio``: Keras' (see :attr:`ImageRecipe.aspect
        <easyfit.data.recipe.ImageRecipe>`), in training and evaluation alike.
        """
        image_size, color_mode = settings.image_size, settings.color_mode
        self.augment = settings.augment
        self.decoder = settings.decoder
        self.transform = settings.transform
        self.interpolation = settings.interpolation
        self.resize = image_size is not None  # inferred sizes are shared by all: nothing to resize
        if color_mode is None or image_size is None:
            sampled = list(sample())
            # the channels alone come from the headers when they tell them: DALI's first
            # pipeline in a process takes seconds to build (docs/performance.md)
            channels = stored_channels(sampled) if image_size is not None else None
            shapes = peek_shapes(sampled) if channels is None else []
            channels = channels or [s[2] for s in shapes]
            if color_mode is None:
                color_mode = "grayscale" if all(c == 1 for c in channels) else "rgb"
            if image_size is None:
                image_size = self._common_size(sampled, shapes, where)
        self.color_mode, self.image_size = color_mode, image_size
        self.normalize = normalization(settings.normalize, self.channels)
        if self.normalize is not None:
            self.scale = None  # the pixels arrive normalised
        eval_crop = settings.eval_crop
        if eval_crop is None and self.random_crop:
            eval_crop = EVAL_CROP
        if eval_crop is not None and not (0 < eval_crop <= 1 and self.resize):
            raise ValueError(f"eval_crop={eval_crop!r}: expected a fraction in (0, 1], with image_size given")
        self.eval_crop = eval_crop
        self.aspect = _aspect(
            settings.crop_to_aspect_ratio,
            settings.pad_to_aspect_ratio,
            self.resize,
            self.random_crop,
            eval_crop,
        )

    @property
    def random_crop(self) -> bool:
        """Whether training crops at random (``Augment(random_resized_crop=...)``)."""
        return bool(getattr(self.augment, "random_resized_crop", None))

    @staticmethod
    def _common_size(
        sampled: Sequence[tuple[str, bytes]], shapes: list[tuple[int, ...]], where: str
    ) -> tuple[int, int]:
        sizes = {(s[0], s[1]) for s in shapes}
        if len(sizes) > 1:
            (a, data_a), sa = sampled[0], shapes[0][:2]
            (b, data_b), sb = next((n, s[:2]) for n, s in zip(sampled, shapes, strict=True) if s[:2] != sa)
            raise DataError(
                f"{where}: images differ in size ({a} is {sa[0]}x{sa[1]}{turned(data_a)}, {b} is "
                f"{sb[0]}x{sb[1]}{turned(data_b)}); resize them all: "
                "ef.data.ImageFolder(path, image_size=(h, w)) (or the image_size= of the source you use)"
            )
        return sizes.pop()

    @property
    def channels(self) -> int:
        return self.image_recipe().channels

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(height, width, channels)`` of the images the model receives."""
        return self.image_recipe().shape

    def decoded_spec(self) -> tuple[tuple[int, int, int], np.dtype] | None:
        """``(image_shape, dtype)`` of the images :meth:`decode` gives, known without decoding
        when every image is resized to ``image_size`` (and decoded to ``color_mode``'s
        channels): uint8, or float16 when normalised. None for inferred sizes (an image of
        another size among those not sampled is the data's fault, told by the pipelines' run),
        and when a ``transform`` or a plain-function ``augment`` may change shape or dtype."""
        from .augment import Augment

        if not self.resize or self.transform is not None:
            return None
        if not (self.augment is None or isinstance(self.augment, Augment)):
            return None
        return self.image_shape, np.dtype(np.float16 if self.normalize is not None else np.uint8)

    @property
    def sample_nbytes(self) -> int:
        pixel = 2 if self.normalize is not None else 1  # float16 or uint8
        return pixel * int(np.prod(self.image_shape)) + 4  # and an int32 label

    def image_settings(self) -> dict[str, Any]:
        """The keyword arguments that give another split the same images (size, color,
        normalisation, and evaluation's center crop when this one trains on random crops)."""
        return {
            "image_size": self.image_size if self.resize else None,
            "color_mode": self.color_mode,
            "decoder": self.decoder,
            "transform": self.transform,
            "normalize": self.normalize,
            "eval_crop": self.eval_crop,
            **({f"{self.aspect}_to_aspect_ratio": True} if self.aspect != "stretch" else {}),
            **({"interpolation": self.interpolation} if self.interpolation != "bilinear" else {}),
        }

    def image_recipe(self) -> ImageRecipe:
        """How evaluation prepares this source's decoded images (``easyfit.data.recipe``)."""
        return ImageRecipe(
            self.image_size,
            self.resize,
            self.color_mode,
            self.normalize,
            self.eval_crop,
            self.aspect,
            self.interpolation,
        )

    def recipe(self) -> dict[str, Any]:
        """The source's recipe (``Source.recipe``) with its images' (``"images"``)."""
        return {**super().recipe(), "images": self.image_recipe().to_json()}  # type: ignore[misc]

    @staticmethod
    def recipe_settings(recipe: Mapping[str, Any]) -> dict[str, Any]:
        """The image settings (keyword arguments) a recipe gives; none without images."""
        images = recipe.get("images")
        return ImageRecipe.from_json(images).settings() if images else {}

    @classmethod
    def from_recipe(cls, path: str | os.PathLike, recipe: Mapping[str, Any]) -> Any:
        """A source of this kind at ``path`` preparing images as ``recipe`` says."""
        return cast("Any", cls)(path, **cls.recipe_settings(recipe))

    def check_same_images(self, other: EncodedImages, name: str, other_name: str) -> None:
        """DataError unless ``other`` delivers images of this source's size."""
        if other.image_size != self.image_size:
            (h, w), (oh, ow) = other.image_size, self.image_size
            raise DataError(
                f"{other_name}: images are {h}x{w} but those of {name} are "
                f"{oh}x{ow}; resize them: ef.data.ImageFolder(path, image_size=(h, w)) (or the "
                "image_size= of the source you use)"
            )

    def decode_device(self, device: str) -> str:
        """Where images are decoded when the pipeline's outputs are wanted on ``device``."""
        if device == "cpu" or self.decoder == "cpu":
            return "cpu"
        if self.decoder == "mixed":
            return "mixed"
        return "cpu" if self.image_size[0] * self.image_size[1] < _SMALL_AREA else "mixed"

    @property
    def uses_gpu(self) -> bool:
        """True when images are decoded on the GPU (``decode_device("gpu") == "mixed"``)."""
        return self.decode_device("gpu") == "mixed"

    def decode(
        self, encoded: Any, *, device: str, draws: dict[str, Any] | None = None, mask: bool = False
    ) -> Any:
        """DALI graph: encoded bytes -> HWC images on ``device`` of ``image_size``.

        With ``draws`` (training batches, see ``easyfit.data.Augment``): the image decoded, its
        random crop sliced (the window from the decoded shape) and resized, then the other
        augmentations. Without, for a source with ``eval_crop``: the shorter side resized
        to ``image_size / eval_crop`` and the center cropped; else a plain resize. Then
        ``transform``, then ``normalize`` (``fn.crop_mirror_normalize``, fused with the center
        crop and the flip, float16 out); uint8 otherwise.

        ``mask=True`` decodes single-channel class-id maps (segmentation masks, the size of
        their images) through the same geometry, so that they stay aligned with the images
        decoded from the same draws: the same crop window, resize, center crop, padded crop,
        flip and rotation, with nearest-neighbour sampling (class ids are never blended), on
        the CPU; no ``transform``, photometric change or normalisation. HW1 uint8 out.
        """
        from nvidia.dali import fn, types

        from .augment import Augment

        where = "cpu" if mask else self.decode_device(device)
        gray = mask or self.color_mode == "grayscale"
        kind = types.DALIImageType.GRAY if gray else types.DALIImageType.RGB
        augment = self.augment if draws is not None and isinstance(self.augment, Augment) else None
        geometry = self.image_recipe()
        if augment is not None:  # training: eval_crop is evaluation's; a random crop's window is sliced
            geometry = dataclasses.replace(
                geometry, eval_crop=None, aspect="stretch" if augment.random_resized_crop else geometry.aspect
            )
        center = geometry.cover is not None
        gpu: dict[str, Any] = {"hw_decoder_load": HW_DECODER_LOAD} if where == "mixed" else {}
        nearest: dict[str, Any] = (
            {"interp_type": types.DALIInterpType.INTERP_NN, "antialias": False} if mask else {}
        )
        images = fn.decoders.image(encoded, device=where, output_type=kind, **gpu)
        if augment is not None and draws is not None and augment.random_resized_crop:
            # the window from the decoded images' shapes: fn.peek_image_shape would open an
            # image codec of its own (on a GPU, about a second of each first build, the
            # interpreter lock held: docs/performance.md)
            start, size = Augment.window(draws, images.shape())
            images = fn.slice(images, start, size, axis_names="HW")
        if device == "gpu" and where == "cpu":
            images = images.gpu()
        if augment is None and not mask:  # evaluation, prediction: the recipe alone
            return self.image_recipe().prepare(images, self.transform)
        images = geometry.resized(images, **nearest)
        if self.transform is not None and not mask:
            images = self.transform(images)
        fused_flip = self.normalize is not None  # the image's flip is fused into its normalisation
        mirror: Any = 0
        flips = False
        if augment is not None and draws is not None:
            images = augment.after_decode(images, draws, flip=not fused_flip, mask=mask)
            flips = augment.flip
            mirror = draws["flip"] if flips else 0
        if self.normalize is not None and not mask:
            mean, std = self.normalize
            crop: dict[str, Any] = {"crop": list(self.image_size)} if center else {}
            images = fn.crop_mirror_normalize(
                images,
                mirror=mirror,
                dtype=types.DALIDataType.FLOAT16,
                mean=[255 * m for m in mean],
                std=[255 * s for s in std],
                output_layout="HWC",
                **crop,
            )
        elif center:
            images = fn.crop(images, crop=list(self.image_size))
        elif fused_flip and flips:  # a mask flips last, as its image in the normalisation
            images = fn.flip(images, horizontal=mirror)
        return images


def _aspect(crop: bool, pad: bool, resize: bool, random_crop: bool, eval_crop: float | None) -> str:
    """The :attr:`ImageRecipe.aspect <easyfit.data.recipe.ImageRecipe>` that Keras' two
    arguments ask for, or ValueError for a combination that cannot hold."""
    if not (crop or pad):
        return "stretch"
    name = "crop_to_aspect_ratio" if crop else "pad_to_aspect_ratio"
    if crop and pad:
        raise ValueError("crop_to_aspect_ratio and pad_to_aspect_ratio: give one of them, not both")
    if not resize:
        raise ValueError(
            f"{name}=True: needs image_size, the aspect ratio to keep: "
            f"ef.data.ImageFolder(path, image_size=(h, w), {name}=True)"
        )
    if random_crop:
        raise ValueError(
            f"{name}=True with Augment(random_resized_crop=...): the random crop's window decides "
            "the aspect ratio; leave one of them out"
        )
    if pad and eval_crop is not None:
        raise ValueError(
            f"pad_to_aspect_ratio=True with eval_crop={eval_crop}: a padded image has no center to crop"
        )
    return "crop" if crop else "pad"


def read_file(path: str) -> bytes:
    """The bytes of ``path``; DataError naming it when it cannot be read."""
    return storage_for(path).read(path)
