"""The formats a path can hold, each registered by its own module: how it is recognised, from
one listing of a folder (``easyfit.data.storage.Listing``) or from a file's name, and which
source reads it. ``easyfit.data.detect`` asks them in order of priority.

A format's module registers it where it defines its source::

    register(Format("webdataset", WebDataset, suffixes=(".tar",), priority=FILES,
                    recognise=holding(".tar"), object_storage=True))

and ``easyfit/data/sources/__init__.py`` imports the module, which is the one line that makes
``detect`` know it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...errors import DataError

if TYPE_CHECKING:
    from ..storage import Listing
    from .base import Source

__all__ = [
    "CLASS_FOLDERS",
    "FALLBACK",
    "FILES",
    "FIRST",
    "LAYOUT",
    "Format",
    "formats",
    "holding",
    "in_folder",
    "register",
]

#: Priorities, lowest asked first: a file that names the format (``data.mdb``); files of the
#: format (two formats of one priority recognised in one folder are refused as ambiguous); a
#: layout of sub-folders (``images/`` + ``masks/``); class folders of a kind of file; what is
#: taken when nothing else is recognised. Plain numbers: a format may sit between two.
FIRST, FILES, LAYOUT, CLASS_FOLDERS, FALLBACK = 10, 20, 50, 60, 100


@dataclasses.dataclass(frozen=True)
class Format:
    """How a format is recognised, and what reads it.

    Attributes:
        name: the format's name, unique (registering a name again replaces it).
        source: the source class that reads it; None for data that is refused (``refusal``).
        recognise: whether a folder holds this format, from its one listing; None: no folder.
        priority: the order in which folders are recognised (lowest first); formats of equal
            priority that both recognise a folder make it ambiguous (a DataError).
        suffixes: a file whose name ends with one of these (any case) is of this format.
        pattern: whether a path is a pattern of this format's files (a glob of Parquet files).
        object_storage: whether the source reads it from a bucket (``s3://``) too.
        refusal: for data easyfit does not read: the DataError that says what to do instead.
    """

    name: str
    source: type[Source] | None
    recognise: Callable[[Listing], bool] | None = None
    priority: int = FILES
    suffixes: tuple[str, ...] = ()
    pattern: Callable[[str], bool] | None = None
    object_storage: bool = False
    refusal: Callable[[str], DataError] | None = None

    @property
    def title(self) -> str:
        """The name a message gives it: its source class's, else its own."""
        return self.source.__name__ if self.source is not None else self.name

    def reader(self, path: str, remote: bool = False) -> type[Source]:
        """The source class that reads ``path`` of this format (``remote``: in a bucket), or
        the DataError that says why it is not read."""
        if self.source is None:
            raise (self.refusal(path) if self.refusal else DataError(f"{path}: {self.name} data is not read"))
        if remote and not self.object_storage:
            works = ", ".join(sorted({f.title for f in formats() if f.object_storage and f.source}))
            raise DataError(
                f"{path}: {self.title} data on object storage is not read by easyfit yet (s3:// works "
                f"for {works}); copy it to a local disk (aws s3 sync), or store it in one of those formats"
            )
        return self.source


_FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Adds ``fmt`` to the formats ``detect`` recognises (replacing one of the same name)."""
    _FORMATS[fmt.name] = fmt
    return fmt


def formats() -> list[Format]:
    """The registered formats, by priority (then in the order they were registered)."""
    return sorted(_FORMATS.values(), key=lambda f: f.priority)


def holding(*suffixes: str) -> Callable[[Listing], bool]:
    """A recogniser: the folder holds a file whose name ends with one of ``suffixes``."""
    return lambda listing: bool(listing.with_suffix(suffixes))


def in_folder(path: str, listing: Listing) -> type[Source]:
    """The source class for folder ``path``, from its ``listing``: the format recognised at the
    first priority at which one is (two of one priority: a DataError, the folder is ambiguous)."""
    known = formats()
    for priority in sorted({f.priority for f in known}):
        found = [f for f in known if f.priority == priority and f.recognise and f.recognise(listing)]
        if len({f.title for f in found}) > 1:
            raise DataError(
                f"{path}: holds files of several formats "
                f"({', '.join(f.title for f in found)}); give one source explicitly, "
                "e.g. ef.data.RecordIO(path)"
            )
        if found:
            return found[0].reader(path, listing.storage.remote)
    raise DataError(f"{path}: no format recognises this folder")
