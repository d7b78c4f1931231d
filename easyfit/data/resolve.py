"""What users pass (a path, arrays, a source) -> a Source."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, cast

from ..errors import DataError
from .detect import detect
from .refuse import refuse, unsupported
from .sources.arrays import Arrays
from .sources.base import Source
from .sources.capabilities import base_of
from .sources.folder import IMAGE_EXTENSIONS, ImageFiles, ImageFolder
from .sources.parquet import hf_splits
from .storage import storage_for

__all__ = ["VALIDATION_NAMES", "split_layout", "to_source"]

#: Sub-folders of a data root taken for validation, in order of preference.
VALIDATION_NAMES = ("val", "validation", "test", "testing")


def split_layout(root: str | os.PathLike) -> tuple[str, str | None] | None:
    """``(train, validation or None)`` when ``root`` holds ``train/``, or Parquet shards of a
    ``train`` split in Hugging Face's layout (``data/train-*.parquet``: the splits are glob
    patterns, validation the first of :data:`VALIDATION_NAMES` there); else None.

    Each of ``train/`` and ``val/`` may be of any format (``easyfit.data.detect``).

    Example:
        >>> import os, tempfile
        >>> from easyfit.data import split_layout
        >>> root = tempfile.mkdtemp()
        >>> for d in ("train", "test"):
        ...     os.makedirs(os.path.join(root, d))
        >>> [os.path.basename(p) for p in split_layout(root)]
        ['train', 'test']
    """
    root = os.fspath(root)
    listing = storage_for(root).listdir(root)  # one listing, shared with hf_splits
    if listing is None:
        return None
    folders = {e.name for e in listing.dirs}
    if "train" not in folders:
        splits = hf_splits(listing)
        if "train" not in splits:
            return None
        return splits["train"], next((splits[v] for v in VALIDATION_NAMES if v in splits), None)
    val = next((os.path.join(root, v) for v in VALIDATION_NAMES if v in folders), None)
    return os.path.join(root, "train"), val


def to_source(
    data: Any,
    y: Any = None,
    *,
    like: Source | None = None,
    argument: str = "x",
    sample_weight: Any = None,
    inputs_only: bool = False,
    recipe: Mapping[str, Any] | None = None,
    folder_settings: Mapping[str, Any] | None = None,
) -> Source:
    """A Source from a path, arrays (or a dict or tuple of arrays), an ``(x, y)`` tuple or a
    Source.

    Args:
        data: the data.
        y: labels, when ``data`` is an array (or a dict or tuple of arrays).
        like: a source whose settings (image size, color mode, ...) a path of the same format
            should share, e.g. the training data when resolving the validation folder.
        argument: the argument's name, for error messages.
        sample_weight: one weight per sample, with arrays.
        inputs_only: ``data`` holds inputs only (prediction): a tuple is a tuple of inputs,
            never ``(x, y)``.
        recipe: the trained model's input recipe (``Source.recipe()``): a path of another
            format than ``like``'s, or with no ``like``, is read as it says
            (``Source.from_recipe``), and arrays too (``Arrays.prepared``).
        folder_settings: image settings (``ImageFolder``'s keyword arguments) for a path read
            as an image folder when neither ``like`` nor ``recipe`` decides them: the
            preprocessing of a model's pretrained weights.
    """
    if sample_weight is not None and not (
        isinstance(data, (dict, tuple, list)) or hasattr(data, "__array__")
    ):
        raise ValueError(
            "sample_weight: given with arrays only; for another source, weight samples in its data"
        )
    if isinstance(data, Source):
        return data
    refuse(data, argument)  # generators, datasets, data loaders, lists of batches
    base = None if like is None else base_of(like)
    if inputs_only and _image_paths(data):
        return _image_files(data, base, recipe)
    if isinstance(data, (str, os.PathLike)):
        if y is not None:
            raise ValueError(f"y: not used with a path ({os.fspath(data)}); labels come from the data")
        kind = detect(data)
        if type(base) is kind:
            sibling = base.sibling(data)
            if sibling is not None:
                return sibling
        if recipe is not None:
            return kind.from_recipe(data, recipe)
        if folder_settings is not None and kind is ImageFolder:
            return ImageFolder(data, **folder_settings)
        return cast("Callable[..., Source]", kind)(data)  # every detected kind takes a path
    if isinstance(data, (list, tuple)) and data and all(isinstance(p, (str, os.PathLike)) for p in data):
        raise ValueError(
            f"{argument}: a list of image paths has no labels (predict reads one); give a folder "
            "of class folders"
        )
    if isinstance(data, tuple) and y is None and len(data) == 2 and not inputs_only:
        data, y = data  # (x, y)
    elif not (isinstance(data, (dict, tuple, list)) or hasattr(data, "__array__")):
        raise unsupported(data, argument)
    try:
        return Arrays.prepared(recipe, data, y, sample_weight=sample_weight)
    except DataError as e:
        if argument == "x":
            raise
        raise DataError(f"{argument}: {e}") from None  # its x, y: not fit's x and y


def _image_paths(data: Any) -> bool:
    """Whether prediction's ``data`` names images without labels: a non-empty list of paths, an
    image file, or a folder that holds images (with or without class folders)."""
    if isinstance(data, (list, tuple)):
        return bool(data) and all(isinstance(p, (str, os.PathLike)) for p in data)
    if not isinstance(data, (str, os.PathLike)):
        return False
    path = os.fspath(data)
    if path.lower().endswith(IMAGE_EXTENSIONS):
        return storage_for(path).isfile(path)
    return detect(path) is ImageFolder  # (its errors are those of reading the path as data)


def _image_files(data: Any, like: Source | None, recipe: Mapping[str, Any] | None) -> ImageFiles:
    """The images of ``data`` (a folder, a file, a list of paths) for prediction, read as the
    training folder's (``like``), else as ``recipe`` says, else with the defaults."""
    if isinstance(like, ImageFolder):
        images = ImageFiles(data, **like.image_settings(), **like.listing())
        like.check_same_images(images, like.root, images.root)
        return images
    if recipe is not None:
        return cast("ImageFiles", ImageFiles.from_recipe(data, recipe))
    return ImageFiles(data)
