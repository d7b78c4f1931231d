"""Image folders: ``root/<class>/<image>``, read and decoded by DALI."""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import DataError
from .. import object_store
from ..check_pool import CheckPool
from ..images import EncodedImages, read_file, sample_positions
from ..validation.samples import sample_problem
from .base import IndexedSource

__all__ = [
    "IMAGE_EXTENSIONS",
    "ClassFiles",
    "Files",
    "ImageFolder",
    "entries",
    "folder_files",
    "path_table",
    "scan_classes",
]

IMAGE_EXTENSIONS = (
    ".jpg",
    ".jpeg",
    ".png",
    ".bmp",
    ".webp",
    ".tif",
    ".tiff",
    ".pnm",
    ".ppm",
    ".pgm",
    ".pbm",
    ".jp2",
)


def _listed(folder: str) -> list[os.DirEntry]:
    """``os.scandir(folder)`` as a list; DataError naming ``folder`` when it cannot be listed."""
    try:
        with os.scandir(folder) as listing:
            return list(listing)
    except OSError as e:
        raise DataError(
            f"{folder}: cannot be listed ({e.strerror or e}); give the user who trains read "
            "and execute permission on it (chmod a+rx), or move it out of the data"
        ) from None


def entries(folder: str, kind: str = "file") -> list[os.DirEntry]:
    """The entries of ``folder`` that are files (``kind="file"``) or directories (``"dir"``),
    following symlinks.

    Nothing is skipped without a word: DataError names ``folder`` when it cannot be listed (no
    read permission), and an entry that cannot be followed: a symlink loop, or a broken
    symlink (its target is gone), which would otherwise drop a sample silently.

    Example:
        >>> import os
        >>> from easyfit.data.sources.folder import entries
        >>> os.symlink("loop", DOCS_TMP + "/loop")
        >>> entries(DOCS_TMP)
        Traceback (most recent call last):
        ...
        easyfit.errors.DataError: .../loop: cannot be followed (Too many levels of symbolic links)...
    """
    found = []
    for entry in _listed(folder):
        try:
            if entry.is_file() if kind == "file" else entry.is_dir():
                found.append(entry)
            elif entry.is_symlink() and not os.path.exists(entry.path):
                os.stat(entry.path)  # raises: the loop's or the missing target's error
        except OSError as e:
            link = (
                f"; a symbolic link to {os.readlink(entry.path)!r}: fix or remove it"
                if entry.is_symlink()
                else ""
            )
            raise DataError(f"{entry.path}: cannot be followed ({e.strerror or e}){link}") from None
    return found


def folder_files(folder: str, extensions: tuple[str, ...]) -> list[str]:
    """The sorted paths of the files in ``folder`` whose names end with one of ``extensions``
    (in any case), with the errors of :func:`entries`.

    One ``os.scandir`` and one pass over its entries; a folder holding anything else than
    such files (other files, folders, links) is looked at again entry by entry, so that a link
    that cannot be followed is named.

    Example:
        >>> import os
        >>> from easyfit.data.sources.folder import folder_files
        >>> for name in ("b.PNG", "a.jpg", "notes.txt"):
        ...     open(os.path.join(DOCS_TMP, name), "w").close()
        >>> [os.path.basename(p) for p in folder_files(DOCS_TMP, (".jpg", ".png"))]
        ['a.jpg', 'b.PNG']
    """
    listed = _listed(folder)
    try:
        paths = [e.path for e in listed if e.is_file() and e.name.lower().endswith(extensions)]
    except OSError:
        paths = []  # an entry that cannot be followed: named below
    if len(paths) < len(listed):
        paths = [e.path for e in entries(folder) if e.name.lower().endswith(extensions)]
    paths.sort()
    return paths


def scan_classes(
    root: str, extensions: tuple[str, ...], what: str = "images", class_names: Sequence[str] | None = None
) -> tuple[list[str], list[str], np.ndarray]:
    """``(class names, files, labels)`` of ``root/<class>/<file>`` with one of ``extensions``:
    files sorted by class folder, then by name (:func:`folder_files`).

    ``class_names`` fixes the class names (and so the labels: their indices), e.g. those of the
    training folder when reading the validation folder, which may lack some.

    Example:
        >>> import os
        >>> from easyfit.data.sources.folder import scan_classes
        >>> for path in ("cat/1.png", "cat/0.png", "dog/2.jpg"):
        ...     os.makedirs(os.path.dirname(os.path.join(DOCS_TMP, path)), exist_ok=True)
        ...     open(os.path.join(DOCS_TMP, path), "w").close()
        >>> names, files, labels = scan_classes(DOCS_TMP, (".png", ".jpg"))
        >>> names, [os.path.relpath(f, DOCS_TMP) for f in files], labels.tolist()
        (['cat', 'dog'], ['cat/0.png', 'cat/1.png', 'dog/2.jpg'], [0, 0, 1])
    """
    isdir: Callable[[str], bool] = os.path.isdir
    dirs: Callable[..., Sequence[Any]] = entries
    files_of: Callable[[str, tuple[str, ...]], list[str]] = folder_files
    if object_store.is_url(root):  # s3://bucket/prefix: the same questions, of one listing
        remote = object_store.listing(root)
        isdir, dirs, files_of = remote.isdir, remote.entries, remote.files
    if not isdir(root):
        raise DataError(f"{root}: no such directory")
    found = sorted(e.name for e in dirs(root, "dir") if not e.name.startswith("."))
    if not found:
        raise DataError(f"{root}: no class folders (expected {root}/<class>/<{what}>)")
    names = list(found if class_names is None else class_names)
    label_of: dict[str, int] = {}
    for label, name in enumerate(names):
        label_of.setdefault(name, label)  # the first, as list.index
    unknown = [c for c in found if c not in label_of]
    if unknown:
        more = " ..." if len(names) > 10 else ""
        raise DataError(
            f"{os.path.join(root, unknown[0])}: not one of the classes {names[:10]}{more} "
            f"(the class folders of {root}: {found[:10]}{' ...' if len(found) > 10 else ''}); "
            "the labels would mean other classes"
        )
    folders = [os.path.join(root, name) for name in found]
    listed = [files_of(folder, extensions) for folder in folders]
    counts = np.array([len(paths) for paths in listed], np.int64)
    files = list(itertools.chain.from_iterable(listed))
    if not files:
        raise DataError(
            f"{root}: no {what} in any class folder (extensions looked for: {', '.join(extensions)})"
        )
    empty = [folder for folder, n in zip(folders, counts, strict=True) if n == 0]
    if empty and class_names is None:  # another split may lack a training class
        raise DataError(
            f"{empty[0]}: class folder with no {what}"
            + (f" (and {len(empty) - 1} more)" if len(empty) > 1 else "")
        )
    labels = np.repeat(np.array([label_of[name] for name in found], np.int32), counts)
    return names, files, labels


def path_table(files: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(table, lengths)``: the paths as one zero-padded uint8 byte table, a row per file, and
    their lengths ``(n, 1)``: what :meth:`Files.read` cuts back into paths inside DALI.

    Built from the paths joined by NUL (which no path holds) and encoded once, in numpy.

    Example:
        >>> from easyfit.data.sources.folder import path_table
        >>> table, lengths = path_table(["a.png", "bc.png"])
        >>> table.shape, lengths.ravel().tolist()
        ((2, 6), [5, 6])
    """
    if not files:
        return np.zeros((0, 0), np.uint8), np.zeros((0, 1), np.int32)
    joined = np.frombuffer(os.fsencode("\0".join(files)), np.uint8)
    ends = np.flatnonzero(joined == 0)
    if len(ends) != len(files) - 1:
        bad = next(f for f in files if "\0" in f)
        raise DataError(f"{bad!r}: a path with a NUL character, which no file system allows")
    bounds = np.concatenate(([-1], ends, [len(joined)]))
    lengths = (np.diff(bounds) - 1).astype(np.int32)
    table = np.zeros((len(files), int(lengths.max())), np.uint8)
    table[np.arange(table.shape[1]) < lengths[:, None]] = joined[joined != 0]
    return table, lengths[:, None]


class Files(IndexedSource):
    """Base of sources with one file per sample (or a few: an image and its mask), read by
    ``fn.io.file.read``.

    :meth:`feed_paths` feeds each column of paths as ``(table, lengths)``. The first time a
    sample is fed, and whenever its files changed since, its files are checked on the host
    (readable, not empty, the whole of an image...: :mod:`easyfit.data.validation`): a broken
    file raises DataError naming it instead of reaching DALI. The checks run in checker child
    processes, ahead of the feed where the pipelines say what comes next
    (:class:`~easyfit.data.check_pool.CheckPool`): :attr:`sample_check` names the check they
    run, which :meth:`sample_problem` runs in this process.
    """

    files: list[str]
    #: The check of a sample's files, by name (``easyfit.data.validation.samples.SAMPLE_CHECKS``):
    #: what checker processes run. None: :meth:`sample_problem` is overridden, and runs here.
    sample_check: str | None = "file"

    def _init_paths(self, *columns: Sequence[str]) -> None:
        """Path tables of ``columns`` (``self.files`` first, then e.g. the masks)."""
        self._columns = [list(column) for column in columns]
        self._tables = [path_table(column) for column in columns]
        self._checks: CheckPool | None = None  # started at the first feed
        self._checks_lock = threading.Lock()

    @property
    def num_samples(self) -> int:
        return len(self.files)

    def _pool(self) -> CheckPool:
        with self._checks_lock:
            if self._checks is None:
                self._checks = CheckPool(self._tables, self._check_name())
            return self._checks

    def _check_name(self) -> str | None:
        """:attr:`sample_check`, unless a subclass overrides :meth:`sample_problem` below the
        class that names it: then the children only stat, and that method checks, here."""
        mro = type(self).__mro__
        named = next(c for c in mro if "sample_check" in vars(c))
        checked = next(c for c in mro if "sample_problem" in vars(c))
        return self.sample_check if issubclass(named, checked) else None

    def prepare(self, indices: np.ndarray) -> None:
        """Starts checking, in the checker processes and without waiting, the samples of
        ``indices`` never fed yet (the next batch's), so that their feed finds them checked."""
        self._pool().ahead(indices)

    def feed_paths(self, indices: np.ndarray) -> list[np.ndarray]:
        """``[table, lengths]`` rows of ``indices`` for each column of paths, once each sample is
        checked (DataError naming the file): the first time it is fed, and again whenever one
        of its files changed since (the batch's files stat'ed by the checker processes, but
        those checked ahead within ``check_pool.FRESH_SECONDS``): a file replaced after
        start-up, e.g. between epochs, never reaches DALI unchecked."""
        found = self._pool().problem(indices, self.sample_problem)
        if found is not None:
            index, problem = found
            raise DataError(f"{self.locate(index)}: {problem}")
        return [part[indices] for table in self._tables for part in table]

    def close(self) -> None:
        """Stops the checker processes (a later feed starts them again)."""
        checks = getattr(self, "_checks", None)
        if checks is not None:
            checks.close()

    @staticmethod
    def read(paths: Any, lengths: Any) -> Any:
        """DALI graph: the bytes of each file, from the fed ``(paths, lengths)``.

        Paths travel as one zero-padded byte table (one dense array per batch, where a list of
        per-file arrays would cost Python work per file to feed) and are cut to length by DALI.
        Files are read with plain reads: mapping each small file costs several times more, and
        unmapping it stalls every DALI thread of the process (docs/performance.md).
        """
        from nvidia.dali import fn

        path = fn.slice(paths, np.zeros(1, np.int32), lengths, axes=[0])
        # DALI ships a stub for fn.io.file but none for fn.io, so its stubs miss the attribute
        return fn.io.file.read(path, dont_use_mmap=True)  # type: ignore[attr-defined]

    def sampled(self) -> list[tuple[str, bytes]]:
        """``(path, bytes)`` of up to 64 files spread evenly (what image settings are inferred
        from: ``EncodedImages._init_images``)."""
        return [(self.files[i], read_file(self.files[i])) for i in sample_positions(len(self.files))]

    def locate(self, index: int) -> str:
        return self.files[index]

    def sample_problem(self, index: int) -> str | None:
        return sample_problem(self.sample_check or "file", [column[index] for column in self._columns])


class ClassFiles(Files):
    """Base of sources with one file per sample in class folders (``root/<class>/<file>``):
    feeds the file paths and the class indices as labels."""

    root: str
    class_names: list[str]
    labels: np.ndarray

    def _init_files(
        self,
        root: str | os.PathLike,
        extensions: tuple[str, ...],
        what: str,
        class_names: Sequence[str] | None,
    ) -> None:
        self.root = os.fspath(root)
        self.class_names, self.files, self.labels = scan_classes(self.root, extensions, what, class_names)
        self._init_paths(self.files)

    @property
    def num_feeds(self) -> int:
        return 3

    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        return (*self.feed_paths(indices), self.labels[indices])

    def known_labels(self) -> np.ndarray:
        return self.labels


class ImageFolder(EncodedImages, ClassFiles):
    """Images in class folders: ``root/<class>/<image>``.

    Labels are the indices of the sorted class-folder names (``class_names``). Images are read
    with ``fn.io.file.read`` in the order easyfit's sampler asks for and decoded by DALI
    (``fn.decoders.image``: JPEG, PNG, BMP, WebP, TIFF, ...), on the GPU or the CPU (see
    ``decoder``). Batches reach the model as NHWC float32 in [0, 1]. Files are only read, never
    written; a file that is not an image, is empty or cannot be read raises DataError naming it.

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
            validation folder takes the training folder's): sub-folders must be among them and
            may be missing or empty. None: the sorted sub-folder names, none of them empty.
        transform: optional ``f(images) -> images`` on DALI data nodes, applied after decoding
            (and resizing) to every split read from this folder.
        augment: optional ``f(images) -> images`` on DALI data nodes applied to training
            batches only, e.g. ``easyfit.data.Augment(flip=True)`` or ImageNet's
            ``Augment(random_resized_crop=(0.08, 1.0))``.
        normalize: ``"imagenet"`` (ImageNet's mean and std) or ``(mean, std)`` (one value, or
            one per channel, on the [0, 1] scale, as torchvision's ``Normalize``): DALI
            subtracts and divides (``fn.crop_mirror_normalize``, fused with the flip and the
            center crop) and batches arrive as float16, cast to the Trainer's precision in the
            step. None (default): float32 in [0, 1].
        eval_crop: evaluation and prediction resize the shorter side to
            ``image_size / eval_crop`` and take the center ``image_size`` (ImageNet's 224 of
            256: 0.875, the default when ``augment`` crops at random; sibling folders such as
            ``val/`` inherit it). None otherwise: a plain resize to ``image_size``. The image
            is resized keeping its aspect ratio to the least size that covers
            ``image_size / eval_crop``, so a non-square ``image_size`` crops as a square one.
        crop_to_aspect_ratio: as Keras: resize each image, keeping its aspect ratio, to cover
            ``image_size`` and take the center, in training and evaluation alike, instead of
            stretching it to ``image_size``.
        pad_to_aspect_ratio: as Keras: resize each image, keeping its aspect ratio, to fit in
            ``image_size`` and pad it with black around the center.

    Example:
        >>> import tempfile, easyfit as ef
        >>> tmp = tempfile.mkdtemp()
        >>> root = ef.datasets.sample_folder(tmp + "/mnist", limit=(200, 50))
        >>> train = ef.data.ImageFolder(root + "/train")
        >>> train.class_names[:3], train.image_shape, len(train)
        (['0', '1', '2'], (28, 28, 1), 200)
    """

    sample_check = "image"

    def __init__(
        self,
        root: str | os.PathLike,
        image_size: tuple[int, int] | None = None,
        color_mode: str | None = None,
        decoder: str = "auto",
        class_names: Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        augment: Callable[[Any], Any] | None = None,
        normalize: Any = None,
        eval_crop: float | None = None,
        crop_to_aspect_ratio: bool = False,
        pad_to_aspect_ratio: bool = False,
    ):
        self._init_files(root, IMAGE_EXTENSIONS, "images", class_names)
        self.augment = augment
        self._init_images(
            self.sampled,
            image_size,
            color_mode,
            decoder,
            transform,
            self.root,
            normalize,
            eval_crop,
            crop_to_aspect_ratio,
            pad_to_aspect_ratio,
        )

    def graph(self, *nodes: Any, device: str, draws: dict[str, Any] | None = None) -> tuple[Any, Any]:
        paths, lengths, labels = nodes  # as feed() returns them
        images = self.decode(self.read(paths, lengths), device=device, draws=draws)
        return images, (labels.gpu() if device == "gpu" else labels)

    def output_spec(self) -> list[tuple[tuple[int, ...], np.dtype]] | None:
        images = self.decoded_spec()
        return None if images is None else [images, ((), self.labels.dtype)]

    @classmethod
    def from_recipe(cls, path: str | os.PathLike, recipe: Mapping[str, Any]) -> ImageFolder:
        """An ImageFolder at ``path`` read as ``recipe`` says, its labels the indices of the
        recorded class names (a class folder not among them raises DataError naming both)."""
        return cls(path, **cls.recipe_settings(recipe), class_names=recipe.get("class_names"))

    def encoded_image(self, index: int) -> bytes | None:
        return read_file(self.files[index])

    def sibling(self, path: str | os.PathLike) -> ImageFolder:
        other = ImageFolder(path, **self.image_settings(), class_names=self.class_names)
        self.check_same_images(other, self.root, other.root)
        return other

    def describe(self) -> str:
        return f"ImageFolder({self.root!r}: {self.num_samples} images, {len(self.class_names)} classes)"
