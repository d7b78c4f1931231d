"""The host checks of one sample of a streamed source, by name: what a checker child process
(``easyfit.data.check_pool``) is told to run, and what the source runs where no child can
start, so that both say the same of the same files.

A check takes the sample's paths (one per column: an image, or an image and its mask) and
returns why the sample cannot be fed, or None; its files are read by ``read``
(:data:`FileCheck`): :func:`~.files.file_check` of a local file by default, what the caller's
storage gives for one kept elsewhere (``easyfit.data.storage.Storage.check``). Checks are
named rather than passed as functions because a child process cannot be handed a source's
bound method; a source names its check in ``Files.sample_check``. Standard library only,
like the rest of this package.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from .encoded import HEAD, encoded_problem, header_size, image_kind
from .files import file_check, file_stamp

__all__ = [
    "SAMPLE_CHECKS",
    "FileCheck",
    "checked_sample",
    "image_size",
    "mask_problem",
    "sample_problem",
    "sample_stamp",
]


class FileCheck(Protocol):
    """``(stamp, problem)`` of one file: what :func:`~.files.file_check` gives of a local one."""

    def __call__(
        self, path: str, check: Callable[..., str | None] | None = None, /
    ) -> tuple[int | None, str | None]: ...


_PNG_COLORS = {0: "grayscale", 2: "RGB", 3: "palette", 4: "grayscale+alpha", 6: "RGBA"}


def mask_problem(head: bytes, tail: bytes, size: int, data: bytes | None = None) -> str | None:
    """Why encoded bytes cannot be a mask, or None: a mask is a whole 8-bit single-channel
    (grayscale) PNG whose pixel values are class ids. DALI would turn a palette PNG's indices
    into colours, and a 16-bit PNG's values into 8 bits, so both are refused.

    Example:
        >>> import struct
        >>> from easyfit.data.validation.samples import mask_problem
        >>> palette = b"\\x89PNG\\r\\n\\x1a\\n" + struct.pack(">I4sIIBB", 13, b"IHDR", 4, 4, 8, 3)
        >>> print(mask_problem(palette, b"", 100))
        8-bit palette PNG; a mask must be an 8-bit grayscale PNG of class ids (...)
    """
    if image_kind(head) != "PNG":
        return encoded_problem(head, tail, size, data) or "not a PNG; masks must be PNG (lossless) files"
    if len(head) >= 26 and (head[24], head[25]) != (8, 0):
        depth, color = head[24], head[25]
        return (
            f"{depth}-bit {_PNG_COLORS.get(color, f'color type {color}')} PNG; a mask must be an "
            "8-bit grayscale PNG of class ids (write one with "
            "PIL.Image.fromarray(ids.astype(np.uint8)).save(path); a palette PNG's class ids "
            "are np.asarray(PIL.Image.open(path)))"
        )
    return encoded_problem(head, tail, size, data)


def image_size(path: str) -> tuple[int, int] | None:
    """``(height, width)`` of an encoded image from its header, when it says."""
    with open(path, "rb") as f:
        head = f.read(HEAD)
    kind = image_kind(head)
    size = header_size(kind, head) if kind else None
    return (size[1], size[0]) if size else None


def _file(paths: Sequence[str], read: FileCheck = file_check) -> tuple[int | None, str | None]:
    return read(paths[0])


def _image(paths: Sequence[str], read: FileCheck = file_check) -> tuple[int | None, str | None]:
    return read(paths[0], encoded_problem)


def _segmentation(paths: Sequence[str], read: FileCheck = file_check) -> tuple[int | None, str | None]:
    image, mask = paths
    stamp, problem = read(image, encoded_problem)
    if problem:
        return None, problem
    mask_stamp, problem = read(mask, mask_problem)
    if problem:
        return None, f"its mask {mask}: {problem}"
    size, mask_size = image_size(image), image_size(mask)
    if size is not None and mask_size is not None and size != mask_size:
        (h, w), (mh, mw) = size, mask_size
        return None, f"{h}x{w} image, but its mask {mask} is {mh}x{mw}; a mask must be its image's size"
    return _joined([stamp, mask_stamp]), None


#: The checks by name: ``"file"`` (readable and not empty), ``"image"`` (that, and its bytes
#: an encoded image: ``encoded_problem``), ``"segmentation"`` (an image and its mask: an
#: 8-bit grayscale PNG of the image's size). Each returns the sample's stamp as its files were
#: read (see :func:`checked_sample`) and its problem.
SAMPLE_CHECKS: dict[str, Callable[[Sequence[str], FileCheck], tuple[int | None, str | None]]] = {
    "file": _file,
    "image": _image,
    "segmentation": _segmentation,
}


def sample_problem(check: str, paths: Sequence[str], read: FileCheck = file_check) -> str | None:
    """What check ``check`` (a name of :data:`SAMPLE_CHECKS`) finds wrong with the sample of
    ``paths`` (its files read by ``read``), or None."""
    return SAMPLE_CHECKS[check](paths, read)[1]


def checked_sample(check: str, paths: Sequence[str]) -> tuple[int, str | None]:
    """``(stamp, problem)``: :func:`sample_problem`, and the sample's :func:`sample_stamp` as
    its files were when they were read (from the open files: a checker child stamps a sample it
    checks without another ``os.stat`` of each file). The stamp is 0 where there is a problem."""
    stamp, problem = SAMPLE_CHECKS[check](paths, file_check)
    return (0, problem) if problem or stamp is None else (stamp, None)


def sample_stamp(paths: Sequence[str]) -> int:
    """One number for the state of a sample's files (:func:`~.files.file_stamp` of each), never
    0 but where one of them cannot be stat'ed: a sample whose stamp changed is checked again."""
    return _joined([file_stamp(p) for p in paths])


def _joined(stamps: list[int | None]) -> int:
    """One sample's stamp from its files': 0 where one is None."""
    if None in stamps:
        return 0
    if len(stamps) == 1:
        return stamps[0]  # type: ignore[return-value]
    return hash(tuple(stamps)) or 1
