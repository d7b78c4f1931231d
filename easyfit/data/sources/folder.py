"""Image folders: ``root/<class>/<image>``, read and decoded by DALI."""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import DataError
from ..check_pool import CheckPool
from ..images import EncodedImages, ImageOptions, ImageSettings, read_file, sample_positions
from ..storage import Storage, entries, storage_for, unfollowable
from ..storage import listed as _listed
from ..validation.samples import sample_problem
from .base import IndexedSource, bad_sample, plain_names
from .registry import FALLBACK, Format, register

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "IMAGE_EXTENSIONS",
    "ClassFiles",
    "Files",
    "ImageFiles",
    "ImageFolder",
    "ImagePaths",
    "LeftOut",
    "entries",
    "folder_files",
    "path_table",
    "scan_classes",
    "walk_files",
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


class LeftOut:
    """What a listing left out of a folder, by reason: how many entries, and the first one's
    path (what :meth:`sentence` says once, at ``verbose >= 1``)."""

    def __init__(self) -> None:
        self.found: dict[str, list[Any]] = {}  # reason -> [count, first path]

    def add(self, reason: str, path: str, count: int = 1) -> None:
        """Counts ``count`` entries left out for ``reason``, ``path`` the first of them."""
        seen = self.found.setdefault(reason, [0, path])
        seen[0] += count

    def sentence(self, root: str) -> str | None:
        """``"left out of <root>: not images: 3 (e.g. <path>); hidden: 1 (...)"``, or None."""
        if not self.found:
            return None
        parts = [f"{reason}: {n} (e.g. {path})" for reason, (n, path) in self.found.items()]
        return f"left out of {root}: " + "; ".join(parts)


def _is_loop(target: str, real: str) -> bool:
    """Whether a link to ``target`` (a real path) inside the folder whose real path is
    ``real`` leads back to it or above it: a walk following it would never end."""
    return real == target or real.startswith(target.rstrip(os.sep) + os.sep)


def _walk_listings(
    storage: Storage, folder: str, kept: Callable[[str, str], bool], not_kept: str, tally: LeftOut
) -> list[str]:
    """:func:`walk_files` of a folder in object storage (no links to follow), from the
    listings its ``storage`` gives (a bucket's: one listing of the prefix)."""
    found: list[str] = []
    pending = [folder]
    while pending:
        here = pending.pop()
        listing = storage.listdir(here)
        files = []
        for e in listing.files if listing else ():
            if e.name.startswith("."):
                tally.add("hidden", e.path)
            elif kept(e.name, e.path):
                files.append(e.path)
            else:
                tally.add(not_kept, e.path)
        found.extend(sorted(files))
        for e in sorted(listing.dirs if listing else (), key=lambda e: e.name, reverse=True):
            if e.name.startswith("."):
                tally.add("hidden", e.path)
            else:
                pending.append(e.path)
    return found


def walk_files(
    folder: str,
    extensions: tuple[str, ...],
    *,
    what: str = "images",
    follow_links: bool = True,
    is_valid_file: Callable[[str], bool] | None = None,
    left_out: LeftOut | None = None,
) -> list[str]:
    """The files in ``folder`` and its sub-folders, at any depth, whose names end with one of
    ``extensions`` (any case), or that ``is_valid_file(path)`` accepts when given (then instead
    of the extensions, as torchvision's): a folder's files sorted by name, then its
    sub-folders', in the order of their names. ``s3://bucket/prefix`` too (its one listing).

    Hidden entries (names starting with ``.``) are left out, and so are files refused;
    ``left_out`` counts them. Links to folders are followed (``follow_links=False``: left out
    and counted); a link back to a folder above it raises DataError naming it, and so does an
    entry that cannot be followed (:func:`entries`). One ``os.scandir`` per folder, no
    ``stat`` but of links: a folder of image files alone costs one pass over its entries.

    Example:
        >>> import os
        >>> from easyfit.data.sources.folder import walk_files
        >>> for path in ("b.png", "a/c.jpg", "a/b/d.png", ".e.png", "f.txt"):
        ...     os.makedirs(os.path.dirname(os.path.join(DOCS_TMP, path)), exist_ok=True)
        ...     open(os.path.join(DOCS_TMP, path), "w").close()
        >>> [os.path.relpath(p, DOCS_TMP) for p in walk_files(DOCS_TMP, (".png", ".jpg"))]
        ['b.png', 'a/c.jpg', 'a/b/d.png']
    """
    tally = left_out if left_out is not None else LeftOut()
    not_kept = f"not {what}" if is_valid_file is None else "refused by is_valid_file"

    def kept(name: str, path: str) -> bool:
        return is_valid_file(path) if is_valid_file is not None else name.lower().endswith(extensions)

    storage = storage_for(folder)
    if storage.remote:  # no links to follow
        return _walk_listings(storage, folder, kept, not_kept, tally)
    found: list[str] = []
    # (folder, its real path once needed, the real paths of the folders above it)
    stack: list[tuple[str, str | None, tuple[str, ...]]] = [(folder, None, ())]
    while stack:
        here, real, above = stack.pop()
        listed = _listed(here)
        try:  # the common case (every entry an image file, no link) in one pass
            if is_valid_file is None:
                files = [
                    e.path
                    for e in listed
                    if e.is_file() and (n := e.name).lower().endswith(extensions) and n[0] != "."
                ]
            else:
                files = []
        except OSError:
            files = []  # an entry that cannot be followed: named below
        subs: list[os.DirEntry] = []
        if len(files) < len(listed):
            files = []
            for e in listed:
                if e.name.startswith("."):
                    tally.add("hidden", e.path)
                    continue
                try:
                    if e.is_dir():
                        if e.is_symlink() and not follow_links:
                            tally.add("links to folders (follow_links=False)", e.path)
                        else:
                            subs.append(e)
                    elif e.is_file():
                        if kept(e.name, e.path):
                            files.append(e.path)
                        else:
                            tally.add(not_kept, e.path)
                    else:
                        os.stat(e.path)  # raises: a loop's or a missing target's error
                        tally.add("neither files nor folders", e.path)
                except OSError as err:
                    raise unfollowable(e, err) from None
        files.sort()
        found.extend(files)
        if subs:
            real = real or os.path.realpath(here)
            chain = (*above, real)
            for e in sorted(subs, key=lambda e: e.name, reverse=True):
                sub_real = os.path.join(real, e.name)
                if e.is_symlink():
                    sub_real = os.path.realpath(e.path)
                    if sub_real in chain or _is_loop(sub_real, real):
                        raise DataError(
                            f"{e.path}: a symbolic link to {os.readlink(e.path)!r}, which leads back "
                            "to a folder it is in: a loop, which a walk would follow forever; remove "
                            "it, or pass follow_links=False"
                        )
                stack.append((e.path, sub_real, chain))
    return found


def scan_classes(
    root: str,
    extensions: tuple[str, ...],
    what: str = "images",
    class_names: Sequence[str] | None = None,
    *,
    allow_empty: bool = False,
    follow_links: bool = True,
    is_valid_file: Callable[[str], bool] | None = None,
    left_out: LeftOut | None = None,
) -> tuple[list[str], list[str], np.ndarray]:
    """``(class names, files, labels)`` of ``root/<class>/.../<file>`` with one of
    ``extensions``: each class folder's files at any depth (:func:`walk_files`), the class
    folders in the order of the class names.

    ``class_names`` (Keras' argument) reads those class folders only, in that order, labelled
    by their place (a name given twice: its first); each must have a folder, holding files
    unless ``allow_empty``. With ``allow_empty`` (torchvision's argument) a class folder may be
    empty, and with ``class_names`` too absent: the classes of another split (the training
    folder's, read for the validation folder), where a folder of another class is refused (its
    label would mean another class); without it, such a folder is left out, as Keras does.
    ``left_out`` counts what is not read: hidden entries, files beside the class folders, files
    that are not of the kind looked for, class folders not named (:class:`LeftOut`).

    Example:
        >>> import os
        >>> from easyfit.data.sources.folder import scan_classes
        >>> for path in ("cat/1.png", "cat/0.png", "dog/2.jpg", "dog/old/3.jpg"):
        ...     os.makedirs(os.path.dirname(os.path.join(DOCS_TMP, path)), exist_ok=True)
        ...     open(os.path.join(DOCS_TMP, path), "w").close()
        >>> names, files, labels = scan_classes(DOCS_TMP, (".png", ".jpg"))
        >>> names, [os.path.relpath(f, DOCS_TMP) for f in files], labels.tolist()
        (['cat', 'dog'], ['cat/0.png', 'cat/1.png', 'dog/2.jpg', 'dog/old/3.jpg'], [0, 0, 1, 1])
        >>> scan_classes(DOCS_TMP, (".png", ".jpg"), class_names=["dog"])[1:]
        (['.../dog/2.jpg', '.../dog/old/3.jpg'], array([0, 0], dtype=int32))
    """
    listing = storage_for(root).listdir(root)
    if listing is None:
        raise DataError(f"{root}: no such directory")
    tally = left_out if left_out is not None else LeftOut()
    found = []
    for e in sorted(listing.dirs, key=lambda e: e.name):
        if e.name.startswith("."):
            tally.add("hidden", e.path)
        else:
            found.append(e.name)
    if not found:
        raise DataError(f"{root}: no class folders (expected {root}/<class>/<{what}>)")
    for e in listing.files:
        reason = "hidden" if e.name.startswith(".") else "beside the class folders"
        tally.add(reason, e.path)
    names = list(found) if class_names is None else plain_names(class_names)
    label_of: dict[str, int] = {}
    for label, name in enumerate(names):
        label_of.setdefault(name, label)  # the first, as list.index
    folders_of = set(found)
    missing = [name for name in label_of if name not in folders_of]
    if missing and not allow_empty:
        raise DataError(
            f"{os.path.join(root, missing[0])}: no such class folder, for class_names={names[:10]}"
            f"{' ...' if len(names) > 10 else ''} (the class folders of {root}: {found[:10]}"
            f"{' ...' if len(found) > 10 else ''}; the `class_names` passed did not match the names "
            "of the sub-folders, as Keras says); name existing folders, or for a split that lacks a "
            "class, read it with allow_empty=True (fit does for its validation folder)"
        )
    unknown = [c for c in found if c not in label_of]
    if unknown and allow_empty and class_names is not None:
        more = " ..." if len(names) > 10 else ""
        raise DataError(
            f"{os.path.join(root, unknown[0])}: not one of the classes {names[:10]}{more} "
            f"(the class folders of {root}: {found[:10]}{' ...' if len(found) > 10 else ''}); "
            "the labels would mean other classes"
        )
    for name in unknown:
        tally.add("class folders not in class_names", os.path.join(root, name))
    read = [name for name in label_of if name in folders_of]  # class_names' order, each once
    folders = [os.path.join(root, name) for name in read]
    walk = functools.partial(
        walk_files,
        extensions=extensions,
        what=what,
        follow_links=follow_links,
        is_valid_file=is_valid_file,
        left_out=tally,
    )
    listed = [walk(folder) for folder in folders]
    counts = np.array([len(paths) for paths in listed], np.int64)
    files = list(itertools.chain.from_iterable(listed))
    if not files:
        looked = "files is_valid_file accepts" if is_valid_file else f"extensions {', '.join(extensions)}"
        raise DataError(f"{root}: no {what} in any class folder ({looked} looked for)")
    empty = [folder for folder, n in zip(folders, counts, strict=True) if n == 0]
    if empty and not allow_empty:
        raise DataError(
            f"{empty[0]}: class folder with no {what}"
            + (f" (and {len(empty) - 1} more)" if len(empty) > 1 else "")
            + "; remove it, or pass allow_empty=True to keep its class"
        )
    labels = np.repeat(np.array([label_of[name] for name in read], np.int32), counts)
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

    def __init__(self, *columns: Sequence[str]) -> None:
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
            raise bad_sample(self, *found)
        return [part[indices] for table in self._tables for part in table]

    def close(self) -> None:
        """Stops the checker processes (a later feed starts them again)."""
        if self._checks is not None:
            self._checks.close()

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
        from: ``EncodedImages``)."""
        return [(self.files[i], read_file(self.files[i])) for i in sample_positions(len(self.files))]

    def locate(self, index: int) -> str:
        return self.files[index]

    def sample_problem(self, index: int) -> str | None:
        paths = [column[index] for column in self._columns]
        return sample_problem(self.sample_check or "file", paths, storage_for(paths[0]).check)


class ClassFiles(Files):
    """Base of sources with one file per sample in class folders (``root/<class>/<file>``, at
    any depth below the class folder): feeds the file paths and the class indices as labels."""

    root: str
    class_names: list[str]
    labels: np.ndarray
    #: What the listing left out of the folder (hidden entries, other files...), in words.
    left_out: str | None = None

    def __init__(
        self,
        root: str | os.PathLike,
        extensions: tuple[str, ...],
        what: str,
        class_names: Sequence[str] | None,
        **listing: Any,
    ) -> None:
        """Lists ``root`` (:func:`scan_classes`, with ``listing``'s keyword arguments)."""
        self.root = os.fspath(root)
        tally = LeftOut()
        self.class_names, self.files, self.labels = scan_classes(
            self.root, extensions, what, class_names, left_out=tally, **listing
        )
        self.left_out = tally.sentence(self.root)
        Files.__init__(self, self.files)

    @property
    def num_feeds(self) -> int:
        return 3

    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        return (*self.feed_paths(indices), self.labels[indices])

    def known_labels(self) -> np.ndarray:
        return self.labels


class ImagePaths(EncodedImages, Files):
    """Base of sources of one encoded image file per sample and a row of ``labels`` per
    sample: feeds the paths and the labels; DALI reads and decodes the images."""

    sample_check = "image"
    labels: np.ndarray

    @property
    def num_feeds(self) -> int:
        return 3

    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        return (*self.feed_paths(indices), self.labels[indices])

    def graph(self, *nodes: Any, device: str, draws: dict[str, Any] | None = None) -> tuple[Any, Any]:
        paths, lengths, labels = nodes  # as feed() returns them
        images = self.decode(self.read(paths, lengths), device=device, draws=draws)
        return images, (labels.gpu() if device == "gpu" else labels)

    def output_spec(self) -> list[tuple[tuple[int, ...], np.dtype]] | None:
        images = self.decoded_spec()
        return None if images is None else [images, (tuple(self.labels.shape[1:]), self.labels.dtype)]

    def encoded_image(self, index: int) -> bytes | None:
        return read_file(self.files[index])


class ImageFolder(ImagePaths, ClassFiles):
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
        class_names: the classes to read, in label order, as Keras' argument: only these
            class folders are read (an ordered subset: ``["c", "a"]`` labels ``c`` 0 and ``a``
            1; the other folders are left out, and said). Each must have a folder holding
            images, unless ``allow_empty``. None: the sorted sub-folder names.
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
        interpolation: the resize filter, by Keras' names: ``"bilinear"`` (default),
            ``"bicubic"``, ``"nearest"``, ``"lanczos3"`` or ``"gaussian"`` (DALI's, antialiased);
            the input recipe carries it to evaluation, checkpoints and exports.
        allow_empty: torchvision's argument: a class folder may hold no image (its class is
            kept, with no sample), and with ``class_names`` it may be absent too: the classes
            of another split (fit reads a ``val/`` folder so, with the training folder's
            classes), where a folder of a class not among them is refused instead of left out.
        follow_links: follow links to folders inside the class folders (default True, as
            torchvision; Keras' default is False); False leaves them out, and says so. A link
            back to a folder it is in raises DataError naming it.
        is_valid_file: torchvision's filter: ``f(path) -> bool`` says which files are read,
            instead of the image extensions (hidden files are left out either way).

    Example:
        >>> import tempfile, easyfit as ef
        >>> tmp = tempfile.mkdtemp()
        >>> root = ef.datasets.sample_folder(tmp + "/mnist", limit=(200, 50))
        >>> train = ef.data.ImageFolder(root + "/train")
        >>> train.class_names[:3], train.image_shape, len(train)
        (['0', '1', '2'], (28, 28, 1), 200)
    """

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
        *,
        interpolation: str = "bilinear",
        allow_empty: bool = False,
        follow_links: bool = True,
        is_valid_file: Callable[[str], bool] | None = None,
    ):
        self.follow_links, self.is_valid_file = follow_links, is_valid_file
        ClassFiles.__init__(
            self,
            root,
            IMAGE_EXTENSIONS,
            "images",
            class_names,
            allow_empty=allow_empty,
            follow_links=follow_links,
            is_valid_file=is_valid_file,
        )
        given = (image_size, color_mode, decoder, transform, augment, normalize, eval_crop)
        settings = ImageSettings(*given, crop_to_aspect_ratio, pad_to_aspect_ratio, interpolation)
        EncodedImages.__init__(self, settings, self.sampled, self.root)

    @classmethod
    def from_recipe(cls, path: str | os.PathLike, recipe: Mapping[str, Any]) -> ImageFolder:
        """An ImageFolder at ``path`` read as ``recipe`` says, its labels the indices of the
        recorded class names (a class folder not among them raises DataError naming both; one
        of them may be absent or empty)."""
        names = recipe.get("class_names")
        return cls(path, **cls.recipe_settings(recipe), class_names=names, allow_empty=names is not None)

    def sibling(self, path: str | os.PathLike) -> ImageFolder:
        other = ImageFolder(
            path,
            **self.image_settings(),
            class_names=self.class_names,
            allow_empty=True,
            **self.listing(),
        )
        self.check_same_images(other, self.root, other.root)
        return other

    def listing(self) -> dict[str, Any]:
        """The keyword arguments that list another folder as this one (links, the filter)."""
        return {"follow_links": self.follow_links, "is_valid_file": self.is_valid_file}

    def describe(self) -> str:
        return f"ImageFolder({self.root!r}: {self.num_samples} images, {len(self.class_names)} classes)"


class ImageFiles(ImagePaths):
    """Images without labels, as ``predict`` reads them: every image of a folder and of its
    sub-folders at any depth, with or without class folders (Keras' ``labels=None``), one
    image file, or a list of image paths. Read in that order: a folder's images sorted by
    name, then its sub-folders' in the order of their names (for class folders: the order of
    ``ImageFolder.files``), each as evaluation reads it (no augmentation). ``files`` holds the
    paths, one per prediction.

    Args:
        images: a folder (or ``s3://bucket/prefix``), an image file, or a sequence of paths.
        follow_links: as :class:`ImageFolder`'s, for a folder.
        is_valid_file: as :class:`ImageFolder`'s, for a folder.
        **settings: the image settings of :class:`ImageFolder` (``image_size``, ``color_mode``,
            ``decoder``, ``transform``, ``normalize``, ``eval_crop``, ``crop_to_aspect_ratio``,
            ``pad_to_aspect_ratio``; no ``augment``): ``predict`` takes the training data's.

    Example:
        >>> import tempfile, easyfit as ef
        >>> root = ef.datasets.sample_folder(tempfile.mkdtemp() + "/mnist", limit=(20, 10))
        >>> images = ef.data.ImageFiles(root + "/val")
        >>> len(images), images.class_names, images.files[0][len(root):]
        (10, None, '/val/0/...png')
    """

    #: No labels: only ``predict`` reads it (its labels are zeros no step sees).
    labelled = False
    #: What the listing of a folder left out (hidden entries, other files...), in words.
    left_out: str | None = None

    def __init__(
        self,
        images: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        follow_links: bool = True,
        is_valid_file: Callable[[str], bool] | None = None,
        **settings: Unpack[ImageOptions],
    ):
        if isinstance(images, (str, os.PathLike)):
            self.root = os.fspath(images)
            storage = storage_for(self.root)
            if storage.isdir(self.root):
                tally = LeftOut()
                files = walk_files(
                    self.root,
                    IMAGE_EXTENSIONS,
                    follow_links=follow_links,
                    is_valid_file=is_valid_file,
                    left_out=tally,
                )
                self.left_out = tally.sentence(self.root)
                if not files:
                    raise DataError(
                        f"{self.root}: no images in it or its sub-folders (extensions looked for: "
                        f"{', '.join(IMAGE_EXTENSIONS)})"
                    )
            elif storage.isfile(self.root):
                files = [self.root]
            else:
                raise DataError(f"{self.root}: no such file or directory")
        else:
            if not all(isinstance(p, (str, os.PathLike)) for p in images):
                bad = next(p for p in images if not isinstance(p, (str, os.PathLike)))
                raise TypeError(f"x: a list of image paths holds {type(bad).__name__} {bad!r}")
            files = [os.fspath(p) for p in images]
            if not files:
                raise ValueError("x: an empty list of image paths")
            self.root = f"{len(files)} image paths"
        self.files = files
        self.labels = np.zeros(len(files), np.int32)
        Files.__init__(self, self.files)
        images_settings = ImageSettings.of("ImageFiles", settings, without=("augment",))
        EncodedImages.__init__(self, images_settings, self.sampled, self.root)

    def describe(self) -> str:
        return f"ImageFiles({self.root!r}: {self.num_samples} images)"


#: A folder that holds no other format is read as class folders of images (whose own checks
#: say what is missing).
register(Format("image-folder", ImageFolder, lambda listing: True, priority=FALLBACK, object_storage=True))
