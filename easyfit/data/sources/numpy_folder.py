"""Folders of ``.npy`` files: ``root/<class>/<sample>.npy``, decoded by DALI."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import DataError
from ..augment import apply_drawn, refuse_random_crop
from ..images import sample_positions
from ..storage import Listing
from ..validation.files import file_problem
from .base import narrowed, nonfinite_problem
from .folder import IMAGE_EXTENSIONS, ClassFiles
from .registry import CLASS_FOLDERS, Format, register

__all__ = ["NumpyFolder"]


def _header(path: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and data offset from an ``.npy`` header (the data is not read)."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version != (1, 0):
                raise DataError(
                    f"{path}: .npy format version {version[0]}.{version[1]}; DALI "
                    "reads version 1.0 (what np.save writes)"
                )
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            end = f.tell()
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
    except ValueError as e:
        raise DataError(f"{path}: not a NumPy .npy file ({e})") from None
    if dtype.kind not in "biuf" or dtype.hasobject:
        raise DataError(f"{path}: dtype {dtype} is not numeric")
    if fortran and len(shape) > 1:
        raise DataError(
            f"{path}: a Fortran-order array; DALI's numpy decoder reads C order "
            "only: save it with np.save(path, np.ascontiguousarray(a))"
        )
    return tuple(shape), dtype, end


class NumpyFolder(ClassFiles):
    """One ``.npy`` array per sample, in class folders: ``root/<class>/<sample>.npy``.

    Labels are the indices of the sorted class-folder names, as for
    :class:`~easyfit.data.ImageFolder`. Files are read with ``fn.io.file.read`` in easyfit's
    order and decoded by DALI (``fn.decoders.numpy``). Every array must have the same shape and
    dtype (checked on a sample of the files' headers). The first time a file is fed, its header
    is read again, and a float array is read once on the host: NaN or inf raises DataError
    naming the file (the same check and message as :class:`~easyfit.data.Arrays`), and a
    Fortran-order array (which DALI's numpy decoder cannot read) is named too::

        root/
          cat/
            0001.npy      # e.g. uint8 (32, 32, 3), or float32 (128,)
            ...
          dog/
            ...

    Args:
        root: the folder holding one sub-folder per class.
        scale: factor applied to the arrays after casting to float32; the default ``"auto"`` is
            ``1/255`` for uint8 arrays (images) and None (no scaling) for any other dtype.
        augment: optional ``f(x) -> x`` on DALI data nodes for training batches only (for
            HWC image arrays, e.g. ``easyfit.data.Augment(flip=True)``).
        class_names: the classes, in label order (default: the sorted sub-folder names), as
            for :class:`~easyfit.data.ImageFolder`.
        allow_empty: a class folder may hold no file, as for :class:`~easyfit.data.ImageFolder`.

    Example:
        >>> import easyfit as ef
        >>> train = ef.data.NumpyFolder(MNIST_FORMATS["npy"] + "/train")
        >>> len(train), train.sample_shape, train.dtype, train.scale == 1 / 255
        (200, (28, 28, 1), dtype('uint8'), True)
    """

    sample_check = None  # its own sample_problem (numpy), in this process
    #: Whether a file sampled as the source is built (the arrays' shape and dtype) whose
    #: header cannot be read raises DataError; False (``easyfit check``, which lists every
    #: one): it is left out of the sample.
    strict_sample: bool = True

    def __init__(
        self,
        root: str | os.PathLike,
        scale: float | None | str = "auto",
        augment: Callable[[Any], Any] | None = None,
        class_names: Sequence[str] | None = None,
        *,
        allow_empty: bool = False,
    ):
        ClassFiles.__init__(self, root, (".npy",), "NumPy files", class_names, allow_empty=allow_empty)
        headers = []
        for i in sample_positions(len(self.files)).tolist():
            try:
                headers.append((self.files[i], *_header(self.files[i])[:2]))
            except DataError:
                if self.strict_sample or (not headers and i == len(self.files) - 1):
                    raise
        first = headers[0]
        for name, shape, dtype in headers[1:]:
            if (shape, dtype) != first[1:]:
                raise DataError(
                    f"{self.root}: arrays differ ({first[0]} is {first[2]} "
                    f"{first[1]}, {name} is {dtype} {shape}); every sample must "
                    "have one shape and dtype"
                )
        self.sample_shape, self.dtype = first[1], first[2]
        if isinstance(scale, str):
            if scale != "auto":
                raise ValueError(f"scale={scale!r}: expected a number, None or 'auto'")
            scale = 1.0 / 255.0 if self.dtype == np.uint8 else None
        self.scale = scale
        refuse_random_crop(augment, self.root)
        self.augment = augment

    def graph(self, *nodes: Any, device: str, draws: dict[str, Any] | None = None) -> tuple[Any, Any]:
        from nvidia.dali import fn

        paths, lengths, labels = nodes  # as feed() returns them
        x = fn.decoders.numpy(self.read(paths, lengths))
        if len(self.sample_shape) == 3:
            x = fn.reshape(x, layout="HWC")
        if draws is not None:
            x = apply_drawn(self.augment, x, draws)
        if device == "gpu":
            x, labels = x.gpu(), labels.gpu()
        return x, labels

    def sample_problem(self, index: int) -> str | None:
        path = self.files[index]
        problem = file_problem(path)
        if problem:
            return problem
        try:
            shape, dtype, end = _header(path)
        except DataError as e:
            return str(e).removeprefix(f"{path}: ")
        if (shape, dtype) != (self.sample_shape, self.dtype):
            return f"holds {dtype} {shape}, not {self.dtype} {self.sample_shape} like the others"
        expected = end + int(np.prod(shape)) * dtype.itemsize
        size = os.path.getsize(path)
        if size < expected:
            return f"truncated .npy file ({size} of {expected} bytes)"
        if dtype.kind == "f" or dtype.itemsize == 8:  # read once, the first time the file is fed
            a = np.load(path, allow_pickle=False)
            return nonfinite_problem(a) or narrowed(a)[1]  # 64-bit values JAX would narrow
        return None

    @classmethod
    def from_recipe(cls, path: str | os.PathLike, recipe: Mapping[str, Any]) -> NumpyFolder:
        """A NumpyFolder at ``path`` with the recipe's scale and class names."""
        names = recipe.get("class_names")
        return cls(path, scale=recipe.get("scale"), class_names=names, allow_empty=names is not None)

    def sibling(self, path: str | os.PathLike) -> NumpyFolder:
        other = NumpyFolder(path, scale=self.scale, class_names=self.class_names, allow_empty=True)
        if (other.sample_shape, other.dtype) != (self.sample_shape, self.dtype):
            raise DataError(
                f"{other.root}: arrays are {other.dtype} {other.sample_shape} but "
                f"those of {self.root} are {self.dtype} {self.sample_shape}"
            )
        return other

    def describe(self) -> str:
        return (
            f"NumpyFolder({self.root!r}: {self.num_samples} arrays {self.dtype} "
            f"{self.sample_shape}, {len(self.class_names)} classes)"
        )


def _holds_arrays(listing: Listing) -> bool:
    """Whether the first data file found in a folder's class folders (an array or an image)
    is a ``.npy`` file: NumpyFolder's, else ImageFolder's (whose checks say what is missing)."""
    for folder in sorted(listing.dirs, key=lambda e: e.name):
        sub = None if folder.name.startswith(".") else listing.child(folder.name)
        for f in sub.files if sub is not None else ():
            name = f.name.lower()
            if name.endswith(".npy"):
                return True
            if name.endswith(IMAGE_EXTENSIONS):
                return False
    return False


register(Format("numpy-folder", NumpyFolder, _holds_arrays, priority=CLASS_FOLDERS))
