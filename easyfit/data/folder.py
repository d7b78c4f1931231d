"""Image folders: ``root/<class>/<image>``, read and decoded by DALI."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import DataError
from .base import Source

__all__ = ["IMAGE_EXTENSIONS", "ImageFolder"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".pnm", ".ppm",
                    ".pgm", ".pbm", ".jp2")
_SAMPLED = 64          # images decoded to infer color mode and size
_SMALL_AREA = 128 * 128  # below this, CPU decoding beats the GPU's JPEG decoder (see docs)


def _scan(root: str, class_names: Sequence[str] | None
          ) -> tuple[list[str], list[str], np.ndarray]:
    if not os.path.isdir(root):
        raise DataError(f"{root}: no such directory")
    found_classes = sorted(e.name for e in os.scandir(root)
                           if e.is_dir() and not e.name.startswith("."))
    if not found_classes:
        raise DataError(f"{root}: no class folders (expected {root}/<class>/<image files>)")
    classes = list(class_names) if class_names is not None else found_classes
    unknown = sorted(set(found_classes) - set(classes))
    if unknown:
        raise DataError(f"{os.path.join(root, unknown[0])}: class folder not among the training "
                        f"classes {classes}")
    files: list[str] = []
    labels: list[int] = []
    empty = []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        if name not in found_classes:
            continue
        found = sorted(e.path for e in os.scandir(folder)
                       if e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS))
        if not found:
            empty.append(folder)
        files += found
        labels += [label] * len(found)
    if not files:
        raise DataError(f"{root}: no images in any class folder "
                        f"(extensions looked for: {', '.join(IMAGE_EXTENSIONS)})")
    if empty and class_names is None:
        raise DataError(f"{empty[0]}: class folder with no images"
                        + (f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""))
    return classes, files, np.asarray(labels, np.int32)


def _decode_shapes(paths: Sequence[str]) -> list[tuple[int, ...]]:
    """HWC shapes of ``paths``, read from their headers by DALI (channels as stored).

    (``fn.peek_image_shape`` with ``ANY_DATA``; decoding grayscale JPEGs with ``ANY_DATA`` crashes
    DALI 2.4 on the CPU.)
    """
    from nvidia.dali import fn, pipeline_def, types

    data = []
    for p in paths:
        with open(p, "rb") as f:
            data.append(np.frombuffer(f.read(), np.uint8))

    @pipeline_def(batch_size=len(data), num_threads=1, device_id=None, prefetch_queue_depth=1)
    def peek():
        encoded = fn.external_source(source=lambda: data, batch=True, dtype=types.UINT8)
        return fn.peek_image_shape(encoded, image_type=types.ANY_DATA)

    pipe = peek()
    pipe.build()
    try:
        (out,) = pipe.run()
    except RuntimeError as e:
        if len(paths) == 1:
            raise DataError(f"{paths[0]}: cannot be decoded as an image ({_first_line(e)})") from None
        return [s for p in paths for s in _decode_shapes([p])]
    finally:
        del pipe
    return [tuple(int(v) for v in out.at(i)) for i in range(len(data))]


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


class ImageFolder(Source):
    """Images in class folders: ``root/<class>/<image>``.

    Labels are the indices of the sorted class-folder names (``class_names``). Images are read
    with ``fn.io.file.read`` in the order easyfit's sampler asks for and decoded by DALI
    (``fn.decoders.image``), on the GPU or the CPU (see ``decoder``). Batches reach the model as
    NHWC float32 in [0, 1].

    Args:
        root: the folder holding one sub-folder per class.
        image_size: ``(height, width)`` to resize every image to; ``None`` infers it from the
            images, which must then all share one size.
        color_mode: ``"grayscale"``, ``"rgb"``, or ``None`` to infer it (grayscale when the
            sampled images have one channel).
        decoder: where to decode on a GPU: ``"auto"`` (the CPU for images under 128x128,
            where the GPU's hardware JPEG decoder is slower, else ``"mixed"``), ``"mixed"`` or
            ``"cpu"``. On a CPU-only machine decoding is always on the CPU.
        class_names: the classes, in label order, when they must match another folder's (the
            validation folder takes the training folder's); sub-folders must be among them and
            may be missing or empty. None: the sorted sub-folder names, none of them empty.
        transform: optional ``f(images) -> images`` on DALI data nodes, applied after decoding
            (and resizing) to every split read from this folder. easyfit assumes it is random
            (so the decoded dataset is never cached) unless it has an attribute
            ``random = False``.

    Example:
        >>> import easyfit as ef
        >>> root = ef.datasets.mnist(DOCS_TMP + "/mnist", limit=(200, 50), source=MNIST_IDX)
        >>> train = ef.data.ImageFolder(root + "/train")
        >>> train.class_names[:3], train.image_shape, len(train)
        (['0', '1', '2'], (28, 28, 1), 200)
    """

    def __init__(self, root: str | os.PathLike, image_size: tuple[int, int] | None = None,
                 color_mode: str | None = None, decoder: str = "auto",
                 class_names: Sequence[str] | None = None,
                 transform: Callable[[Any], Any] | None = None):
        self.root = os.fspath(root)
        if color_mode not in (None, "grayscale", "rgb"):
            raise DataError(f"color_mode={color_mode!r}: expected 'grayscale', 'rgb' or None")
        if decoder not in ("auto", "mixed", "cpu"):
            raise DataError(f"decoder={decoder!r}: expected 'auto', 'mixed' or 'cpu'")
        if image_size is not None:
            if len(image_size) != 2 or min(image_size) < 1:
                raise DataError(f"image_size={image_size!r}: expected (height, width)")
            image_size = (int(image_size[0]), int(image_size[1]))
        self.class_names, self.files, self.labels = _scan(self.root, class_names)
        self._paths = [np.frombuffer(os.fsencode(f), np.uint8) for f in self.files]
        self.decoder = decoder
        self.transform = transform
        self.resize = image_size is not None  # inferred sizes are shared by all: nothing to resize
        self.color_mode, self.image_size = self._infer(color_mode, image_size)

    def _infer(self, color_mode, image_size):
        if color_mode is not None and image_size is not None:
            return color_mode, image_size
        picks = np.unique(np.linspace(0, len(self.files) - 1, min(_SAMPLED, len(self.files)))
                          .astype(int))
        sampled = [self.files[i] for i in picks]
        shapes = _decode_shapes(sampled)
        if color_mode is None:
            color_mode = "grayscale" if all(s[2] == 1 for s in shapes) else "rgb"
        if image_size is None:
            sizes = {s[:2] for s in shapes}
            if len(sizes) > 1:
                (a, sa), (b, sb) = [(f, s[:2]) for f, s in zip(sampled, shapes)][:1] + [
                    (f, s[:2]) for f, s in zip(sampled, shapes) if s[:2] != shapes[0][:2]][:1]
                raise DataError(f"{self.root}: images differ in size ({a} is {sa[0]}x{sa[1]}, "
                                f"{b} is {sb[0]}x{sb[1]}); pass image_size=(height, width) to "
                                "resize them all")
            image_size = sizes.pop()
        return color_mode, image_size

    @property
    def num_samples(self) -> int:
        return len(self.files)

    @property
    def channels(self) -> int:
        return 1 if self.color_mode == "grayscale" else 3

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (*self.image_size, self.channels)

    @property
    def num_feeds(self) -> int:
        return 2

    @property
    def sample_nbytes(self) -> int:
        return int(np.prod(self.image_shape)) + 4  # uint8 pixels, int32 label

    @property
    def random(self) -> bool:  # type: ignore[override]
        return getattr(self.transform, "random", self.transform is not None)

    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        return [self._paths[i] for i in indices], self.labels[indices]

    def decode_device(self, device: str) -> str:
        """Where images are decoded when the pipeline's outputs are wanted on ``device``."""
        if device == "cpu" or self.decoder == "cpu":
            return "cpu"
        if self.decoder == "mixed":
            return "mixed"
        return "cpu" if self.image_size[0] * self.image_size[1] < _SMALL_AREA else "mixed"

    def graph(self, paths: Any, labels: Any, *, device: str) -> tuple[Any, Any]:
        from nvidia.dali import fn, types

        encoded = fn.io.file.read(paths)
        where = self.decode_device(device)
        gray = self.color_mode == "grayscale"
        images = fn.decoders.image(encoded, device=where,
                                   output_type=types.GRAY if gray else types.RGB)
        if device == "gpu" and where == "cpu":
            images = images.gpu()
        if self.resize:
            images = fn.resize(images, size=list(self.image_size), dtype=types.UINT8)
        if self.transform is not None:
            images = self.transform(images)
        if device == "gpu":
            labels = labels.gpu()
        return images, labels

    def describe(self) -> str:
        return f"ImageFolder({self.root!r}: {self.num_samples} images, {len(self.class_names)} classes)"
