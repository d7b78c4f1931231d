"""What users pass (a path, arrays, a source) -> a Source, decided in one place: the inputs
easyfit does not take refused (:func:`refuse`), the format a path holds detected
(:func:`detect`), and the source built, with the settings of the data it must read alike.

easyfit reads a dataset by sample index: its sampler picks which samples make up each batch, so
that it can shuffle the whole dataset, shard it over devices and resume exactly. Inputs that
can only be iterated (a generator of batches, a ``tf.data.Dataset``, a torch ``DataLoader``)
or that are already cut into batches (a list of ``(x, y)`` batches) cannot be read that way.

Which source reads a path is decided from what it holds, by the formats each source's module
registers (``easyfit.data.sources.registry``), from one listing of a folder (its storage's,
``easyfit.data.storage``: a local folder and a prefix in a bucket alike)."""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any, cast

from ..errors import DataError
from .plan import Windows
from .sources.arrays import Arrays, unscaled_note
from .sources.base import (
    Source,
    base_of,
    data_fingerprint,
    known_labels,
    split_validation,
)
from .sources.folder import IMAGE_EXTENSIONS, ImageFiles, ImageFolder
from .sources.parquet import splits_in
from .sources.registry import FILES, Format, formats, in_folder, register
from .storage import storage_for

__all__ = [
    "SUPPORTED",
    "VALIDATION_NAMES",
    "Sources",
    "TrainingData",
    "detect",
    "image_files_for",
    "refuse",
    "source_for",
    "split_layout",
    "to_source",
    "unsupported",
]

#: Sub-folders of a data root taken for validation, in order of preference.
VALIDATION_NAMES = ("val", "validation", "test", "testing")


# ---------------------------------------------------------------- inputs refused
#: What every refusal says is supported.
SUPPORTED = (
    "Supported: a folder or file path (image folders, .npy folders, RecordIO, TFRecord, "
    "WebDataset, Caffe2 LMDB), arrays x and y (or dicts or tuples of arrays), or an easyfit.data "
    "source; see 'What fit accepts' in docs/data.md"
)

_INDEX = "easyfit reads samples by index, to shuffle, shard and resume exactly"


def _module(data: Any) -> str:
    return type(data).__module__ or ""


def _kind(data: Any) -> tuple[str, str] | None:
    """``(what it is, what to do instead)`` for an input easyfit refuses, else None."""
    module, name = _module(data), type(data).__name__
    if module.startswith("tensorflow") or (
        hasattr(data, "element_spec") and hasattr(data, "as_numpy_iterator")
    ):
        return (
            f"a tf.data.Dataset ({name})",
            "collect it into arrays (np.stack over dataset.unbatch().as_numpy_iterator()), or "
            "write its images to an image folder or TFRecord files",
        )
    if module.startswith("torch.utils.data") or (
        hasattr(data, "dataset") and hasattr(data, "batch_size") and hasattr(data, "__iter__")
    ):
        return (
            f"a torch {name}",
            "pass the arrays or the folder its dataset reads from",
        )
    if inspect.isgenerator(data) or isinstance(data, collections.abc.Iterator):
        return (
            f"a Python {'generator' if inspect.isgenerator(data) else 'iterator'} of batches ({name})",
            "collect its batches into arrays first (np.concatenate), or write the samples to a folder",
        )
    if isinstance(data, list) and data:
        first = data[0]
        if isinstance(first, dict) or (isinstance(first, tuple) and any(hasattr(v, "shape") for v in first)):
            return (
                f"a list of batches ({type(first).__name__}s)",
                "concatenate them: x = np.concatenate([b[0] for b in batches]), y likewise",
            )
        shapes = {getattr(a, "shape", None) for a in data}
        if all(hasattr(a, "__array__") and getattr(a, "ndim", 0) >= 1 for a in data) and len(shapes) > 1:
            return (
                f"a list of {len(data)} arrays of different shapes (a list of batches?)",
                "concatenate the batches with np.concatenate; for several inputs, pass a dict "
                "or tuple of arrays",
            )
    if hasattr(data, "__getitem__") and hasattr(data, "__len__") and not hasattr(data, "__array__"):
        if not isinstance(data, (list, tuple, dict, str, bytes)):
            return (f"a dataset object ({name})", "pass its arrays, or the folder it reads from")
    return None


def refuse(data: Any, argument: str = "x") -> None:
    """Raises TypeError, saying what is supported, for the inputs easyfit cannot read: a
    generator or iterator of batches, a ``tf.data.Dataset``, a torch ``DataLoader`` or
    ``Dataset``, a list of batches, another dataset object.

    Example:
        >>> from easyfit.data.resolve import refuse
        >>> refuse((b for b in []))
        Traceback (most recent call last):
        ...
        TypeError: x: a Python generator of batches (generator) is not supported (...
    """
    kind = _kind(data)
    if kind is not None:
        what, instead = kind
        raise TypeError(f"{argument}: {what} is not supported ({_INDEX}): {instead}. {SUPPORTED}.")


def unsupported(data: Any, argument: str = "x") -> TypeError:
    """The error for an input of a type easyfit does not know."""
    return TypeError(f"{argument}: {type(data).__name__} is not supported. {SUPPORTED}.")


# ---------------------------------------------------------------- a path's format
#: What Hugging Face ``datasets``' ``save_to_disk`` writes for a ``DatasetDict``, beside a folder
#: per split (each of Arrow files, ``dataset_info.json`` and ``state.json``).
_SAVED_DATASET_DICT = "dataset_dict.json"


def _arrow_refusal(path: str) -> DataError:
    """The error for a folder (or file) of Arrow files, as Hugging Face ``datasets``'
    ``save_to_disk`` writes (``data-00000-of-00001.arrow``, ``state.json``)."""
    return DataError(
        f"{path}: these are Arrow files (Hugging Face datasets' save_to_disk), which easyfit "
        "does not read; write them as Parquet with to_parquet "
        "(datasets.load_from_disk(path).to_parquet('data/train.parquet'), read as "
        "ef.data.Parquet), or load them and pass arrays: fit(x, y)"
    )


register(
    Format(
        "arrow",
        None,
        lambda listing: bool(listing.with_suffix((".arrow",))) or _SAVED_DATASET_DICT in listing.names(),
        priority=FILES + 20,
        suffixes=(".arrow",),
        refusal=_arrow_refusal,
    )
)


def detect(path: str | os.PathLike) -> type[Source]:
    """The source class for ``path``, from its contents.

    * a directory holding ``data.mdb``: :class:`~easyfit.data.Caffe2LMDB`;
    * ``.rec`` files (with their ``.idx``): :class:`~easyfit.data.RecordIO`;
    * ``.tar`` shards: :class:`~easyfit.data.WebDataset`;
    * ``.tfrecord``/``.tfrecords``/``.tfrec`` files (with their ``.idx``):
      :class:`~easyfit.data.TFRecord`;
    * ``.parquet`` files, or a ``data/`` folder of them (Hugging Face's layout):
      :class:`~easyfit.data.Parquet`;
    * exactly two folders, ``images/`` and ``masks/``: :class:`~easyfit.data.SegmentationFolder`;
    * class folders of ``.npy`` files: :class:`~easyfit.data.NumpyFolder`;
    * class folders of images: :class:`~easyfit.data.ImageFolder`.

    A folder of Arrow files (Hugging Face ``datasets``' ``save_to_disk``) is refused with a
    DataError that says how to write it as Parquet. In a bucket (``s3://``), the formats that
    are not read from one are refused by name.

    A single file is recognised by its suffix (a ``.csv`` file: :class:`~easyfit.data.ImageCSV`),
    and so is a glob pattern of ``.parquet`` files (``"hf/data/train-*.parquet"``).

    Each format says how it is recognised where its source is defined
    (``easyfit.data.sources.registry``); a folder is listed once.

    Example:
        >>> import easyfit as ef
        >>> from easyfit.data.resolve import detect
        >>> [detect(MNIST_FORMATS[f] + "/train").__name__ for f in ("lmdb", "webdataset", "npy")]
        ['Caffe2LMDB', 'WebDataset', 'NumpyFolder']
    """
    path = os.fspath(path)
    storage = storage_for(path)
    known = formats()
    pattern = next((f for f in known if f.pattern is not None and f.pattern(path)), None)
    if pattern is not None:
        return pattern.reader(path, storage.remote)
    listing = storage.listdir(path)
    if listing is not None:
        return in_folder(path, listing)
    if not storage.isfile(path):
        raise DataError(f"{path}: no such directory")
    for fmt in known:
        if fmt.suffixes and path.lower().endswith(fmt.suffixes):
            return fmt.reader(path, storage.remote)
    expected = [f.suffixes[0] for f in known if f.suffixes and f.source is not None]
    raise DataError(
        f"{path}: a file easyfit cannot read; expected a directory, or a "
        f"{', '.join(expected[:-1])} or {expected[-1]} file"
    )


# ---------------------------------------------------------------- the source
def split_layout(root: str | os.PathLike) -> tuple[str, str | None] | None:
    """``(train, validation or None)`` when ``root`` holds ``train/``, or Parquet shards of a
    ``train`` split in Hugging Face's layout (``data/train-*.parquet``: the splits are glob
    patterns, validation the first of :data:`VALIDATION_NAMES` there); else None.

    Each of ``train/`` and ``val/`` may be of any format (:func:`detect`).

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
    listing = storage_for(root).listdir(root)  # one listing, handed on to find the splits
    if listing is None:
        return None
    folders = {e.name for e in listing.dirs}
    if "train" not in folders:  # Hugging Face's splits: Parquet files of data/ or of the root
        shards = [] if listing.storage.remote else [listing.child("data"), listing]  # local only
        splits = splits_in(*(f.with_suffix((".parquet",)) for f in shards if f is not None))
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
            never ``(x, y)``, and images without labels are read as files
            (:func:`image_files_for`).
        recipe: the trained model's input recipe (``Source.recipe()``): a path of another
            format than ``like``'s, or with no ``like``, is read as it says
            (``Source.from_recipe``), and arrays too (``Arrays.prepared``).
        folder_settings: image settings (``ImageFolder``'s keyword arguments) for a path read
            as an image folder when neither ``like`` nor ``recipe`` decides them: the
            preprocessing of a model's pretrained weights.
    """
    if inputs_only:
        images = image_files_for(data, like, recipe, argument=argument, sample_weight=sample_weight)
        if images is not None:
            return images
    return source_for(data, y, like, argument, sample_weight, inputs_only, recipe, folder_settings)


def _accepted(data: Any, argument: str, sample_weight: Any) -> None:
    """Raises for what easyfit does not read: ``sample_weight`` with anything but arrays, and
    the inputs :func:`refuse` names (a source is taken as it is)."""
    if sample_weight is not None and not (
        isinstance(data, (dict, tuple, list)) or hasattr(data, "__array__")
    ):
        raise ValueError(
            "sample_weight: given with arrays only; for another source, weight samples in its data"
        )
    if not isinstance(data, Source):
        refuse(data, argument)  # generators, datasets, data loaders, lists of batches


def image_files_for(
    data: Any, like: Source | None, recipe: Mapping[str, Any] | None, *, argument: str, sample_weight: Any
) -> ImageFiles | None:
    """Prediction's images without labels, when ``data`` names them (a non-empty list of
    paths, an image file, or a folder that holds images): read as the training folder's
    (``like``), else as ``recipe`` says; else None. What :func:`to_source` returns for them
    with ``inputs_only``; any other data is read by :func:`source_for`."""
    _accepted(data, argument, sample_weight)
    if isinstance(data, Source) or not _image_paths(data):
        return None
    return _image_files(data, None if like is None else base_of(like), recipe)


def source_for(
    data: Any,
    y: Any,
    like: Source | None,
    argument: str,
    sample_weight: Any,
    inputs_only: bool,
    recipe: Mapping[str, Any] | None,
    folder_settings: Mapping[str, Any] | None,
) -> Source:
    """:func:`to_source` for all but prediction's images without labels
    (:func:`image_files_for`): the source that reads fit's and evaluate's data."""
    _accepted(data, argument, sample_weight)
    if isinstance(data, Source):
        return data
    base = None if like is None else base_of(like)
    if isinstance(data, (str, os.PathLike)):
        if y is not None:  # as Keras refuses y beside a dataset
            said = "y: not used" if argument == "x" else f"{argument}: y is not used"
            raise ValueError(f"{said} with a path ({os.fspath(data)}); labels come from the data")
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


# ---------------------------------------------------------------- fit's data
@dataclasses.dataclass(frozen=True)
class TrainingData:
    """fit's data, resolved once (:meth:`Sources.training_data`): the sources and the facts fit reads of
    them, computed there once, so that the trainer reads plain facts and nothing downstream
    asks the sources again.

    Attributes:
        train: the training source.
        validation: the validation source, or None.
        scale: the training data's input scale (what the traced hooks read).
        class_names: the training data's class names, or None.
        labels_known: whether every training label is known before a batch is decoded (the
            first step may then be traced from the data's declared sample spec).
        windows: the windows a shuffled pass reads the training blocks in (``Blocked``), or
            None: decided once, agreed on by the processes and followed by the plan.
        left_out: what the listings of the training and validation folders left out, in
            words (each said once: ``DataInputs.left_out``), for a verbose fit.
        unscaled: for a verbose fit, a sentence when the training data is integer pixels given
            unscaled (``easyfit.data.sources.arrays.unscaled_note``), else None.
        base: the source the training data is a view of (``base_of``: a split's source), or
            the training source itself.
    """

    train: Source
    validation: Source | None
    scale: float | None
    class_names: list[str] | None
    labels_known: bool
    windows: Windows | None
    left_out: tuple[str, ...] = ()
    unscaled: str | None = None
    base: Source | None = None

    @functools.cached_property
    def fingerprint(self) -> dict[str, Any]:
        """What identifies the training data (``easyfit.data.sources.base.data_fingerprint``),
        worked out when first asked (a backup records it, several processes compare it: it
        lists every file's size) and kept for the fit."""
        return data_fingerprint(self.train)

    @functools.cached_property
    def validation_fingerprint(self) -> dict[str, Any] | None:
        """What identifies the validation data, as :attr:`fingerprint`; None without any."""
        return None if self.validation is None else data_fingerprint(self.validation)

    def agreed(self) -> dict[str, Any]:
        """What the processes of a fit compare of its data (``easyfit.distributed.agree_on_fit``):
        the fingerprints, with the sample spec the training data declares."""
        train, validation = self.fingerprint, self.validation_fingerprint
        return {"data": {**train, "sample_spec": self.train.output_spec()}, "validation_data": validation}


#: What a source of a path is kept under: the path, read as inputs only or not, and a
#: pretrained model's image settings or none.
_Key = tuple[str, bool, str | None]


class Sources:
    """What a trainer is given -> its sources, in one place: fit's training and validation
    data resolved together (:meth:`training_data`), evaluate's and predict's data
    (:meth:`kept_source`); one source kept per path, each read alike the training data (its
    settings, or its recipe).

    Attributes:
        train: the last fit's training source, or None.
        recipe: the input recipe data is read with (``Source.recipe()``): the last fit's
            training source's, or a loaded model's; None when unknown.
    """

    def __init__(self) -> None:
        self.train: Source | None = None
        self.recipe: dict[str, Any] | None = None
        self._kept: dict[_Key, Source] = {}

    def training_data(
        self,
        x: Any,
        y: Any = None,
        validation_data: Any = None,
        validation_split: float = 0.0,
        sample_weight: Any = None,
        folder_settings: Mapping[str, Any] | None = None,
        *,
        seed: int = 0,
        verbose: bool = False,
    ) -> TrainingData:
        """fit's data from its arguments: a ``root/train`` + ``root/val`` layout,
        ``validation_split`` held out (seeded by ``seed``), or ``validation_data`` (a source, a
        path, ``(x, y)`` or ``(x, y, sample_weight)``), with the facts fit reads of them (with
        ``verbose``, the note on unscaled pixels); ``DataInputs.fit_data`` adds the batching's
        and the telling's part: the shuffle's windows and what the listings left out.
        ``folder_settings``: image settings for a training path read as an image folder (a
        pretrained model's preprocessing); the validation folder shares the training
        folder's settings."""
        if x is None:
            raise ValueError("fit: give the training data (a folder, a source or arrays)")
        val_path = None
        if isinstance(x, (str, os.PathLike)) and (layout := split_layout(x)) is not None:
            x, val_path = layout
            if validation_split and validation_data is None and val_path is not None:
                raise ValueError(
                    f"validation_split={validation_split}: {os.fspath(layout[0])!r} has its own "
                    f"validation data, {val_path!r}; drop validation_split to validate on it, or "
                    f"pass the training folder alone (fit({os.fspath(layout[0])!r}, "
                    f"validation_split={validation_split})) to hold a part of it out instead"
                )
        train = self._resolve(x, y, sample_weight=sample_weight, folder_settings=folder_settings)
        unscaled = unscaled_note(train) if verbose else None
        base = base_of(train)
        if validation_split and validation_data is None:
            train, validation_data = split_validation(train, validation_split, seed)
        labels_known = known_labels(train) is not None
        self.train, self.recipe = train, train.recipe()
        if validation_data is not None:
            val, argument = validation_data, "validation_data"
        else:
            val, argument = val_path, "x"  # the layout's validation folder, or none
        if val is not None:  # read alike the training data
            parts = val if isinstance(val, tuple) and len(val) in (2, 3) else (val,)  # (x, y[, weights])
            val = self._resolve(*parts, like=base, recipe=self.recipe, argument=argument)
        return TrainingData(
            train,
            val,
            scale=train.scale,
            class_names=train.class_names,
            labels_known=labels_known,
            windows=None,  # the batching's: DataInputs.fit_data decides them
            unscaled=unscaled,
            base=base,
        )

    def kept_source(
        self,
        data: Any,
        y: Any = None,
        sample_weight: Any = None,
        *,
        inputs_only: bool = False,
        argument: str = "x",
    ) -> Source:
        """The source for ``data`` (the same one for the same path), read as the training data
        (its settings, when of the same format), else as the :attr:`recipe` says.
        ``inputs_only``: for prediction (a tuple is a tuple of inputs, not ``(x, y)``, and
        images without labels are read as files); ``argument`` names it in errors."""
        key = _key(data, sample_weight, inputs_only, None)
        if inputs_only and key not in self._kept:  # prediction's images without labels
            images = image_files_for(
                data, self.train, self.recipe, argument=argument, sample_weight=sample_weight
            )
            if images is not None:
                if key is not None:
                    self._kept[key] = images
                return images
        like = None if self.train is None else base_of(self.train)
        return self._resolve(
            data, y, sample_weight, like=like, recipe=self.recipe, inputs_only=inputs_only, argument=argument
        )

    def _resolve(
        self,
        data: Any,
        y: Any = None,
        sample_weight: Any = None,
        *,
        like: Source | None = None,
        recipe: dict[str, Any] | None = None,
        inputs_only: bool = False,
        argument: str = "x",
        folder_settings: Mapping[str, Any] | None = None,
    ) -> Source:
        """The source for ``data`` (:func:`source_for`), kept for its path; ValueError when
        labels are needed and it has none."""
        key = _key(data, sample_weight, inputs_only, folder_settings)
        source = None if key is None or y is not None else self._kept.get(key)
        if source is None:  # (a path with y is refused there: its labels come from its data)
            source = source_for(data, y, like, argument, sample_weight, inputs_only, recipe, folder_settings)
            if key is not None:
                self._kept[key] = source
        if not inputs_only and not source.labelled:
            raise ValueError(f"{argument}: {source.describe()} has no labels: predict reads it")
        return source

    def close(self) -> None:
        """Closes every source kept and forgets them, and the training source."""
        for source in self._kept.values():
            source.close()
        self._kept.clear()
        self.train = None


def _key(
    data: Any, sample_weight: Any, inputs_only: bool, folder_settings: Mapping[str, Any] | None
) -> _Key | None:
    """What a source of ``data`` is kept under (one per path, read as inputs only or not and
    with a pretrained model's settings or not), or None when it is not kept."""
    if not isinstance(data, (str, os.PathLike)) or sample_weight is not None:
        return None
    settings = None if folder_settings is None else repr(sorted(folder_settings.items()))
    return (os.path.abspath(os.fspath(data)), inputs_only, settings)
