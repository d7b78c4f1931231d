"""Images with float targets from a CSV file (``filename,t1,t2,...``), decoded by DALI."""

from __future__ import annotations

import csv
import math
import os
from typing import TYPE_CHECKING

import numpy as np

from ...errors import DataError
from ..images import EncodedImages, ImageOptions, ImageSettings
from .folder import Files, ImagePaths
from .registry import Format, register

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ImageCSV", "read_targets"]


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def read_targets(path: str, root: str) -> tuple[list[str], list[str], np.ndarray]:
    """``(files, target names, targets (n, k) float32)`` of a CSV ``filename,t1,...,tk`` with a
    header row; file names are joined to ``root``. DataError naming the CSV's line (and column)
    of a short or long row, a cell that is not a finite number, or a file that does not exist.

    Example:
        >>> from easyfit.data.sources.image_csv import read_targets
        >>> with open(DOCS_TMP + "/t.csv", "w") as f:
        ...     _ = f.write("file,age\\na.png,x\\n")
        >>> read_targets(DOCS_TMP + "/t.csv", DOCS_TMP)
        Traceback (most recent call last):
        ...
        easyfit.errors.DataError: .../t.csv, line 2, column 'age': 'x' is not a number
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            rows = [(reader.line_num, row) for row in reader]
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
    except (csv.Error, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not a CSV file ({e})") from None
    rows = [(line, row) for line, row in rows if any(cell.strip() for cell in row)]  # blank lines
    if not rows or len(rows[0][1]) < 2:
        raise DataError(
            f"{path}: expected a header row such as 'filename,target' (a file name, then targets)"
        )
    header = [cell.strip() for cell in rows[0][1]]
    if all(_number(cell) is not None for cell in header[1:]):
        raise DataError(
            f"{path}, line {rows[0][0]}: {','.join(header)!r} looks like data; the first row "
            "names the columns (e.g. 'filename,target')"
        )
    names = header[1:]
    if len(rows) == 1:
        raise DataError(f"{path}: no rows after the header")
    files, targets = [], np.empty((len(rows) - 1, len(names)), np.float32)
    for r, (line, row) in enumerate(rows[1:]):
        if len(row) != len(header):
            raise DataError(
                f"{path}, line {line}: {len(row)} cells, but the header has {len(header)} "
                f"(a file name and {len(names)} target{'s' if len(names) > 1 else ''})"
            )
        name = row[0].strip()
        if not name:
            raise DataError(f"{path}, line {line}: no file name")
        for c, (column, cell) in enumerate(zip(names, row[1:], strict=True)):
            value = _number(cell)
            if value is None or not math.isfinite(value):
                what = "is not a number" if value is None else "is not finite"
                raise DataError(f"{path}, line {line}, column {column!r}: {cell.strip()!r} {what}")
            targets[r, c] = value
        file = os.path.join(root, name)
        if not os.path.isfile(file):
            raise DataError(f"{path}, line {line}: {file}: no such file")
        files.append(file)
    return files, names, targets


class ImageCSV(ImagePaths):
    """Images and float targets listed in a CSV file, for regression::

        filename,age,weight        # a header row: the file name, then the targets' names
        0001.jpg,3.5,12.0          # file names relative to the CSV's folder (or to root=)
        photos/0002.png,7.0,20.5
        ...

    Images are read in easyfit's order and decoded by DALI, as those of
    :class:`~easyfit.data.ImageFolder` (NHWC float32 in [0, 1], or normalised); labels ``y``
    are float32 of shape ``(k,)``, one value per target column. The loss when none is given is
    mean squared error (``default_loss``), even where every row sums to 1. Augmentation moves
    the images, never the targets.

    A missing file, a cell that is not a finite number and a row of the wrong length raise
    DataError naming the CSV's line (and column).

    Args:
        csv_path: the CSV file (UTF-8, with a header row).
        root: the folder file names are relative to; default: the CSV's folder.
        **settings: the image settings, :class:`~easyfit.data.ImageFolder`'s keyword arguments
            (``image_size``, ``augment``, ``normalize``, ...: ``easyfit.data.images.ImageOptions``).

    Example:
        >>> import numpy as np, tempfile, easyfit as ef
        >>> tmp = tempfile.mkdtemp()
        >>> for i in range(3):
        ...     ef.datasets.write_png(f"{tmp}/{i}.png", np.full((8, 8), 50 * i, np.uint8))
        >>> with open(tmp + "/targets.csv", "w") as f:
        ...     _ = f.write("file,brightness,double\\n0.png,0,0\\n1.png,50,100\\n2.png,100,200\\n")
        >>> data = ef.data.ImageCSV(tmp + "/targets.csv")
        >>> len(data), data.target_names, data.targets[2].tolist()
        (3, ['brightness', 'double'], [100.0, 200.0])
    """

    default_loss = "mse"

    def __init__(
        self,
        csv_path: str | os.PathLike,
        root: str | os.PathLike | None = None,
        **settings: Unpack[ImageOptions],
    ):
        self.csv_path = os.fspath(csv_path)
        self._root = None if root is None else os.fspath(root)
        self.root = self._root if self._root is not None else os.path.dirname(os.path.abspath(self.csv_path))
        self.files, self.target_names, self.targets = read_targets(self.csv_path, self.root)
        self.labels = self.targets
        Files.__init__(self, self.files)
        EncodedImages.__init__(self, ImageSettings.of("ImageCSV", settings), self.sampled, self.csv_path)

    @property
    def label_dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    @property
    def sample_nbytes(self) -> int:
        return super().sample_nbytes - 4 + self.targets[0].nbytes

    def known_labels(self) -> np.ndarray:
        return self.targets

    def sibling(self, path: str | os.PathLike) -> ImageCSV:
        other = ImageCSV(path, root=self._root, **self.image_settings())
        if other.target_names != self.target_names:
            raise DataError(
                f"{other.csv_path}: targets {other.target_names}, but those of {self.csv_path} "
                f"are {self.target_names}"
            )
        self.check_same_images(other, self.csv_path, other.csv_path)
        return other

    def describe(self) -> str:
        return f"ImageCSV({self.csv_path!r}: {self.num_samples} images, {len(self.target_names)} targets)"


register(Format("image-csv", ImageCSV, suffixes=(".csv",)))
