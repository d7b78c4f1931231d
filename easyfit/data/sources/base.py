"""The source contract: what every format provides, and the two kinds of source.

A source says what its samples are and how DALI turns one into an ``(x, y)`` pair. It knows
nothing of devices, batches, epochs or shuffling: the streams (``easyfit.data.loader``,
``easyfit.data.cache``) own those, and what differs between the two kinds below is decided in
``easyfit.data.loader``.

What every format must provide is a handful of members:

* :class:`Source`: ``num_samples``; ``describe()``, ``locate(index)`` and ``close()`` have
  defaults (a no-op ``close``), and so do the members that say the samples' form, the recipe
  and the checks before a pipeline (a format overrides those its samples need).
* :class:`IndexedSource`: sample ``i`` can be handed to DALI on request. ``feed(indices)`` gives
  the host-side inputs of those samples, one array (or list of per-sample arrays) per DALI
  ``external_source`` (``num_feeds`` of them): cheap (paths, small arrays, the bytes of a
  record), never decoded pixels unless the source is in memory anyway. ``graph(*nodes,
  device=...)`` gives the DALI operators from those inputs to ``(x, y)``: ``x`` HWC (uint8 for
  images), ``y`` one label per sample (or more outputs, named by ``outputs`` and put together
  by ``assemble``: structured arrays).
* :class:`ReaderSource`: a DALI reader chooses the order (``read(shard_id=..., ...)``).

What only some sources can do (labels known up front, a host check of a sample, its encoded
image, labels checked as fed, the files read, ...) is a capability: a ``runtime_checkable``
Protocol defined here too (``easyfit.data.sources.capabilities`` keeps the old import path),
which code tests for with ``isinstance``, never by a source's class. :class:`Subset` has its
source's members as they are, and the capabilities its source has, its samples renumbered;
:func:`split_validation` (``validation_split``) makes two of them.

What identifies any source, cheaply, is worked out here too (:func:`data_fingerprint`): a
backup records it and a resumed fit compares it, and several processes check that they read
the same data.

A new format is one new file in ``easyfit/data/sources/`` (see docs/architecture.md).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import hashlib
import math
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast, overload, runtime_checkable

import numpy as np

from ...errors import DataError
from ..recipe import VERSION as RECIPE_VERSION
from ..storage import storage_for, storage_of

if TYPE_CHECKING:
    from ..plan import Windows

__all__ = [
    "READER",
    "Blocked",
    "DecodedLabels",
    "EncodedSamples",
    "FedLabels",
    "FileBacked",
    "FolderListing",
    "InMemory",
    "IndexedSource",
    "KnownLabels",
    "ReadAtStart",
    "ReaderSource",
    "RecordsLayout",
    "SampleChecks",
    "Source",
    "Subset",
    "View",
    "bad_sample",
    "base_of",
    "check_hint",
    "data_fingerprint",
    "held_out",
    "int32_labels",
    "known_labels",
    "narrowed",
    "nonfinite_problem",
    "outside_classes",
    "plain_names",
    "split_validation",
]

#: The name a ReaderSource gives its DALI reader (``fn.readers.*(..., name=READER)``).
READER = "reader"


# ------------------------------------------------------------------------------ capabilities
# What some sources can do and others cannot, each a Protocol tested for by capability: code
# that needs one asks ``isinstance(source, KnownLabels)`` (these Protocols are
# ``runtime_checkable``), never which class the source is, so that a new format gains a
# capability by having its members. A :class:`Subset` has the capabilities of the source it is
# part of, its samples renumbered.


@runtime_checkable
class KnownLabels(Protocol):
    """A source that knows its labels without decoding."""

    def known_labels(self) -> Any:
        """Every label (checked before training): an array, or a dict or tuple of arrays for
        several outputs; None when, for this data, they are not known after all."""


@runtime_checkable
class FedLabels(Protocol):
    """A source that learns its labels as it feeds them (``known_labels`` None)."""

    def limit_labels(self, num_classes: int) -> None:
        """From now on, a fed class index outside ``0..num_classes - 1`` raises DataError naming
        its sample (and so do those already fed); called once the model's outputs are known."""


@runtime_checkable
class DecodedLabels(Protocol):
    """A source whose labels DALI decodes (a segmentation mask's class ids)."""

    def decoded_label_limit(self) -> int | None:
        """The number of classes the decoded labels must stay below, once ``limit_labels``
        said it: the pipelines check every batch of them and name the sample of one outside."""


@runtime_checkable
class Blocked(Protocol):
    """A source stored in blocks that are read whole (Parquet's row groups)."""

    def shuffle_windows(self) -> Windows | None:
        """How a shuffled pass reads the blocks when they do not all fit the source's cache
        (``easyfit.data.plan.Windows``: each block read once per pass); None: a permutation
        of all the samples."""


@runtime_checkable
class SampleChecks(Protocol):
    """A source that can check one sample on the host, cheaply."""

    def sample_problem(self, index: int) -> str | None:
        """Why sample ``index`` cannot be read (an unreadable or empty file, a broken image),
        or None. Explains a failed batch (``easyfit.data.diagnose``)."""


@runtime_checkable
class EncodedSamples(Protocol):
    """A source of encoded images, one per sample."""

    def encoded_image(self, index: int) -> bytes | None:
        """The encoded image of sample ``index`` (for messages about it)."""


@runtime_checkable
class View(Protocol):
    """The samples of ``source`` at ``indices``."""

    source: Source
    indices: np.ndarray


@runtime_checkable
class InMemory(Protocol):
    """Inputs ``x`` and labels ``y`` held in memory, one row per sample (arrays, or a dict or
    tuple of them)."""

    x: Any
    y: Any


@runtime_checkable
class FileBacked(Protocol):
    """A source read from ``files``, under ``root`` (what ``easyfit check`` is given)."""

    root: str
    files: list[str]


@runtime_checkable
class RecordsLayout(Protocol):
    """Record files indexed when the source was built."""

    def records_layout(self) -> tuple[np.ndarray, ...]:
        """What the index read of the files (byte ranges, row groups, labels): a resumed fit's
        data fingerprint compares it with the backup's."""


@runtime_checkable
class FolderListing(Protocol):
    """A source listed from a folder."""

    #: What the listing left out (hidden entries, other files...), in words; None: nothing.
    left_out: str | None


def base_of(source: Source) -> Source:
    """The source ``source`` is a view of (through every :class:`View`), else itself."""
    while isinstance(source, View):
        source = source.source
    return source


def known_labels(source: Source) -> Any:
    """``source.known_labels()`` when it has :class:`KnownLabels`, else None."""
    return source.known_labels() if isinstance(source, KnownLabels) else None


def nonfinite_problem(a: np.ndarray, unit: str = "element") -> str | None:
    """``"holds NaN or inf (first at <unit> k)"`` for a float array holding one, else None.

    The one check (and message) of every source that holds arrays: ``Arrays`` (``unit="sample"``:
    ``k`` is the row), ``NumpyFolder`` (``k`` is the flat index inside the file).

    Example:
        >>> import numpy as np
        >>> from easyfit.data.sources.base import nonfinite_problem
        >>> nonfinite_problem(np.array([[0.0, 1.0], [np.nan, 2.0]]), unit="sample")
        'holds NaN or inf (first at sample 1)'
        >>> nonfinite_problem(np.arange(3)) is None
        True
    """
    if a.dtype.kind != "f" or np.isfinite(a).all():
        return None
    flat = a.reshape(len(a), -1) if unit == "sample" and a.ndim else a.reshape(-1)
    return f"holds NaN or inf (first at {unit} {int(np.argwhere(~np.isfinite(flat))[0][0])})"


def narrowed(a: np.ndarray, to: Any = None) -> tuple[np.ndarray, str | None]:
    """``a`` in the dtype it reaches the model in, and what that cast would change, if anything.

    float64 becomes float32 (Keras' ``floatx``); int64 and uint64 become int32 and uint32 where
    JAX's 64-bit mode (``jax_enable_x64``) is off, as JAX would make them on their way to the
    devices, silently wrapping a value that does not fit (``2**40`` becomes 0). So every value
    is checked first, vectorised: a problem (``"value v at [i, j] ..."``) names the first
    integer that does not fit, or the first finite float that would become infinite, and the
    array is then returned as it was; ``to`` forces a target dtype (float32 for weights).

    Example:
        >>> import numpy as np
        >>> from easyfit.data.sources.base import narrowed
        >>> print(narrowed(np.array([[1], [2**40]]))[1])
        value 1099511627776 at [1, 0] does not fit int32 (-2147483648 to 2147483647), ...
        >>> a, problem = narrowed(np.array([1.5, 2.0]))
        >>> a.dtype, problem
        (dtype('float32'), None)
    """
    if to is None:
        import jax

        to = np.float32 if a.dtype == np.float64 else jax.dtypes.canonicalize_dtype(a.dtype)
    to = np.dtype(to)
    if to == a.dtype or a.size == 0:
        return a, None
    if to.kind in "iu" and a.dtype.kind in "iu":
        lo, hi = np.iinfo(to).min, np.iinfo(to).max
        if a.min() >= lo and a.max() <= hi:
            return a.astype(to), None
        at = np.unravel_index(int(np.argmax((a < lo) | (a > hi))), a.shape)
        problem = (
            f"does not fit {to} ({lo} to {hi}), the dtype JAX gives {a.dtype} data while its "
            "64-bit mode (jax_enable_x64) is off: it would wrap. Give values that fit (ids "
            "renumbered: np.unique(x, return_inverse=True)[1]), or floats (x.astype('float32'))"
        )
    else:
        with np.errstate(over="ignore"):
            out = a.astype(to)
        if to.kind != "f" or a.dtype.kind != "f":
            return out, None
        overflow = np.isinf(out) & np.isfinite(a)
        if not overflow.any():
            return out, None
        at = np.unravel_index(int(np.argmax(overflow)), a.shape)
        problem = (
            f"is beyond {to}'s range (+-{np.finfo(to).max:.4g}), to which {a.dtype} data is "
            "cast (as Keras casts it): it would become infinite. Scale the values down"
        )
    return a, f"value {a[at]} at [{', '.join(map(str, at))}] {problem}"


_INT32 = np.iinfo(np.int32)


def int32_labels(labels: Any, where: Callable[[int], str]) -> np.ndarray:
    """Class indices as int32, once every one is checked: a whole number that fits.

    A narrowing cast wraps silently (``2**32 + 3`` becomes class 3) and a float one truncates
    (``3.7`` becomes class 3), so both are checked first, vectorised, over every label given;
    DataError names the first one that fails, by ``where(row)``. Integral floats (``3.0``)
    are taken.

    Example:
        >>> import numpy as np
        >>> from easyfit.data.sources.base import int32_labels
        >>> int32_labels(np.array([1, 2**32 + 3]), lambda i: f"y (at x[{i}])")
        Traceback (most recent call last):
        ...
        easyfit.errors.DataError: y (at x[1]): label 4294967299 does not fit a class index ...
        >>> int32_labels([1, 3.7], lambda i: f"record {i}")
        Traceback (most recent call last):
        ...
        easyfit.errors.DataError: record 1: label 3.7 is not a whole number, ...
    """
    a = np.asarray(labels)
    if a.size == 0 or a.dtype.kind not in "iuf":
        return a.astype(np.int32)
    rows = a.reshape(len(a), -1) if a.ndim else a.reshape(1, 1)
    if a.dtype.kind == "f":
        bad = ~np.isfinite(rows) | (rows != np.round(rows))
        if bad.any():
            i = int(np.flatnonzero(bad.any(axis=1))[0])
            raise DataError(
                f"{where(i)}: label {float(rows[i][bad[i]][0]):g} is not a whole number, but the labels "
                "are class indices (integers, as those sampled at start-up); easyfit never "
                "truncates one. Store integer labels, or floats throughout for a loss such as 'mse'"
            )
    bad = (rows < _INT32.min) | (rows > _INT32.max)
    if bad.any():
        i = int(np.flatnonzero(bad.any(axis=1))[0])
        value = rows[i][bad[i]][0]
        shown = int(value) if a.dtype.kind in "iu" else f"{value:.0f}"
        raise DataError(
            f"{where(i)}: label {shown} does not fit a class index (int32, at "
            f"most {_INT32.max}); class indices run from 0 to the number of classes - 1. For "
            "other integer targets pass floats (y.astype('float32')) with a loss such as 'mse'"
        )
    return a.astype(np.int32)


@overload
def plain_names(names: None) -> None: ...
@overload
def plain_names(names: Sequence[Any]) -> list[Any]: ...
def plain_names(names: Sequence[Any] | None) -> list[Any] | None:
    """``names`` as a list of plain Python values: ``np.unique``'s ``np.str_`` become ``str``
    (printed ``'cat'``, not ``np.str_('cat')``), NumPy integers ``int``."""
    if names is None:
        return None
    return [n.item() if isinstance(n, np.generic) else n for n in names]


def check_hint(source: Source) -> str:
    """What a message about a bad file or record adds: the command that lists every bad one of
    the source's data at once (``fit`` stops at the first); empty for a source of no path."""
    base = base_of(source)  # a Subset's: its source's
    if not isinstance(base, FileBacked):
        return ""
    return f" (to list every bad file at once: easyfit check {shlex.quote(base.root)})"


def bad_sample(source: Source, index: int, problem: str) -> DataError:
    """The DataError for sample ``index`` of ``source``, which its host check found bad:
    ``"<file or record>: <problem>"`` and :func:`check_hint`."""
    return DataError(f"{source.locate(index)}: {problem}{check_hint(source)}")


def outside_classes(label: int, num_classes: int) -> str:
    """The message for a class index outside a model's ``num_classes`` outputs."""
    return (
        f"label {label} is outside the model's {num_classes} outputs; class indices must be in "
        f"0..{num_classes - 1}"
    )


def content_stamp(path: str) -> int | None:
    """What tells that the bytes of file ``path`` changed, with no read: its storage's stamp
    (a local file's size, modification time, inode and device: a rewrite, or a new file
    renamed over it, not a ``chmod``; a listed object's size and ETag); None when it cannot
    be stat'ed."""
    return storage_for(path).stamp(path)


class ReadAtStart:
    """The :func:`content_stamp` of a source's files when it read what it keeps of them (labels,
    byte ranges, row groups, the records it checked) as it was built: a file read again later
    must still hold those bytes, or what was read of it no longer describes it.

    Args:
        files: the files, stamped now (before the source reads them).
        what: what the source keeps of them, for the message (``"labels and row groups"``).
    """

    def __init__(self, files: Sequence[str], what: str):
        self.files, self.what = list(files), what
        self._stamps = [content_stamp(f) for f in self.files]

    def check(self, f: int) -> None:
        """DataError naming ``files[f]`` when it changed since it was stamped (one ``os.stat``)."""
        if content_stamp(self.files[f]) != self._stamps[f]:
            raise DataError(
                f"{self.files[f]}: changed since the fit started (its {self.what} were read then, "
                "when the source was built, and no longer describe it); a record file must not be "
                "rewritten while a fit reads it. Write the new version under another name and fit "
                "on that, or start the fit again (a new Trainer, or after trainer.close()) to read "
                "it anew"
            )

    def check_all(self) -> None:
        """:meth:`check` of every file."""
        for f in range(len(self.files)):
            self.check(f)


class Source(abc.ABC):
    """Base class of easyfit's data sources: what every kind says about its samples.

    Subclass :class:`IndexedSource` or :class:`ReaderSource`, not this class. Only
    ``num_samples`` is required here; what only some sources can do (labels known up
    front, a host check of a sample, ...) is an optional capability, tested with ``isinstance``.
    """

    #: Factor applied to ``x`` (cast to float32) in the train step; None to leave it as is.
    scale: float | None = 1.0 / 255.0
    #: Sorted class names when labels are class indices, else None.
    class_names: list[str] | None = None
    #: Training-only augmentation: ``f(x) -> x`` on DALI data nodes (see ``easyfit.data.Augment``).
    augment: Callable[[Any], Any] | None = None
    #: Whether the samples have labels; False: only ``predict`` reads the source.
    labelled: bool = True
    #: The loss (a Keras name) for this source's labels when the Trainer is given none, e.g.
    #: ``"mse"`` for regression targets; None: inferred from the labels (``infer_loss``).
    default_loss: str | None = None

    @property
    @abc.abstractmethod
    def num_samples(self) -> int:
        """Number of samples."""

    def describe(self) -> str:
        """A short human description, used in logs and error messages."""
        return type(self).__name__

    @property
    def label_dtype(self) -> np.dtype:
        """dtype of the labels (integer labels mean class indices)."""
        return np.dtype(np.int32)

    @property
    def sample_nbytes(self) -> int | None:
        """Bytes of one decoded sample (inputs and label), if known without decoding."""
        return None

    def output_spec(self) -> list[tuple[tuple[int, ...], np.dtype]] | None:
        """One sample's ``(shape, dtype)`` of each DALI graph output (in :attr:`outputs`'
        order), when the source knows them without running a pipeline: what lets a GPU fit
        initialise the model and trace the first step while the pipelines' first run is read
        (the loader checks that run against it). None: the first run tells."""
        return None

    @property
    def random(self) -> bool:
        """Whether training batches get random augmentation (``augment=``): such a source is
        never cached, since its samples differ every epoch."""
        return self.augment is not None

    @property
    def uses_gpu(self) -> bool:
        """Whether the source's DALI graph runs operators on the GPU (the GPU image decoder).
        When False, the loader runs the source's pipelines on the host even on GPU machines
        and copies the batches to the devices itself."""
        return False

    @property
    def outputs(self) -> tuple[str, ...]:
        """Names of the DALI graph's outputs, in order (for messages): ``("x", "y")``, or one
        per array of a structured :class:`~easyfit.data.sources.arrays.Arrays`."""
        return ("x", "y")

    def assemble(self, outputs: Sequence[Any]) -> dict[str, Any]:
        """The batch entries from the graph's outputs (global arrays, in :attr:`outputs`'
        order): ``{"x": ..., "y": ...}``, plus ``"sample_weight"`` when the source has them."""
        x, y = outputs
        return {"x": x, "y": y}

    def locate(self, index: int) -> str:
        """Where sample ``index`` comes from (a file, a record), for error messages."""
        return f"{self.describe()}: sample {index}"

    def sibling(self, path: str | os.PathLike) -> Source | None:
        """A source of this kind for another split at ``path``, with the same settings (image
        size, color mode, ...); None when ``path`` holds another kind of data."""
        return None

    def recipe(self) -> dict[str, Any]:
        """The evaluation-time input recipe, as plain JSON: what a trained model needs to know to
        read other data as this source's (``easyfit.data.recipe``). Checkpoints record it.

        Keys: ``version``, ``source`` (this kind's name), ``class_names``, ``scale`` (what the
        step multiplies inputs by), ``images`` (an ``ImageRecipe``'s JSON, for images) and
        ``inputs`` (the structure of array inputs); a kind adds what it knows.
        """
        return {
            "version": RECIPE_VERSION,
            "source": type(self).__name__,
            "class_names": None if self.class_names is None else list(self.class_names),
            "scale": self.scale,
            "images": None,
            "inputs": None,
        }

    @classmethod
    def from_recipe(cls, path: str | os.PathLike, recipe: Mapping[str, Any]) -> Source:
        """A source of this kind reading ``path`` as ``recipe`` (from any kind's
        :meth:`recipe`) says, taking the settings that apply to this kind. Default: the
        kind's defaults."""
        return cast("Any", cls)(path)

    def check(self) -> None:
        """Checks to do before the first pipeline of this source is built (called by the
        loader before each; a source that checks much remembers it did); raises DataError.
        Default: nothing."""

    def close(self) -> None:
        """Releases what the source holds open (files, checker processes); it reopens them
        when read again. Called when the trainer is done with the data. Default: nothing."""

    def __len__(self) -> int:
        return self.num_samples


class IndexedSource(Source):
    """A source whose every sample is addressable by an integer: easyfit's sampler chooses the
    samples of each batch and an ``external_source`` feeds them to the source's DALI graph.

    Subclasses implement ``num_samples``, ``num_feeds``, ``feed`` and ``graph``.
    """

    @property
    @abc.abstractmethod
    def num_feeds(self) -> int:
        """How many arrays ``feed`` returns (one DALI external_source each)."""

    @abc.abstractmethod
    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        """Host inputs for the samples at ``indices`` (one entry per external source)."""

    @abc.abstractmethod
    def graph(self, *nodes: Any, device: str, draws: dict[str, Any] | None = None) -> tuple[Any, ...]:
        """DALI operators turning the fed nodes into ``(x, y)`` (one node per name of
        :attr:`outputs`).

        Args:
            *nodes: the external_source data nodes, in the order of ``feed``'s result.
            device: ``"cpu"`` or ``"gpu"``, where the pipeline's outputs are wanted.
            draws: for training batches of a source whose ``augment`` is an
                ``easyfit.data.Augment``, its random draws as data nodes (see
                ``Augment.names``): the graph applies the augmentation with them.
        """

    def prepare(self, indices: np.ndarray) -> None:
        """Told, without waiting, which samples a later :meth:`feed` will ask for (the next
        batch's), e.g. to check their files ahead; nothing by default."""

    #: Whether :meth:`feed` hands DALI buffers the source keeps and never changes (several
    #: samples may share one): the ``external_source`` then takes them without a copy.
    feeds_shared: bool = False


class ReaderSource(Source):
    """A source read by a DALI reader in its own order (``fn.readers.*``).

    Each pipeline reads one contiguous shard (``shard_id``/``num_shards``), shuffled inside a
    buffer when training, and pads the shard's end with copies of its last sample
    (``pad_last_batch``); the loader masks the padding. Streamed, batches depend on the number
    of pipelines (the device cache reads the source once, unshuffled, and permutes it like an
    indexed source's: ``easyfit.data.cache``); ``validation_split`` is not available
    (see [Data formats](data-formats.md#index-driven-and-reader-driven-sources)).

    Subclasses implement ``num_samples`` and :meth:`read`.
    """

    @abc.abstractmethod
    def read(
        self,
        *,
        shard_id: int,
        num_shards: int,
        shuffle: bool,
        device: str,
        draws: dict[str, Any] | None = None,
    ) -> tuple[Any, Any]:
        """DALI graph from a reader named :data:`READER` to ``(x, y)`` nodes on ``device``
        (``draws``: as for ``IndexedSource.graph``).

        The reader must take ``shard_id``, ``num_shards``, ``random_shuffle=shuffle`` and
        ``pad_last_batch=True``, and support DALI's pipeline checkpointing.
        """

    def check_unchanged(self) -> None:
        """DataError naming a file read when the source was built that changed since (its
        DALI reader would read bytes that were never checked); called before each chunk is
        read, one ``os.stat`` a file. Default: nothing."""


class _Same:
    """A member of a :class:`Subset` that is its source's as it is (a value, a property or a
    bound method): what does not depend on which samples are kept."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, subset: Any, owner: type | None = None) -> Any:
        return self if subset is None else getattr(subset.source, self.name)


class Subset(IndexedSource):
    """The samples of ``source`` at ``indices`` (used by validation_split).

    A Subset is its source renumbered: it has the source's form of samples, recipe and checks,
    and the optional capabilities the source has, its sample numbers mapped through
    ``indices``.

    Example:
        >>> import numpy as np, easyfit as ef
        >>> full = ef.data.Arrays(np.zeros((10, 2, 2, 1), np.uint8), np.arange(10))
        >>> part = ef.data.Subset(full, [1, 3, 5])
        >>> len(part), part.feed(np.array([2]))[1].tolist()
        (3, [5])
        >>> part.known_labels().tolist()
        [1, 3, 5]
    """

    source: IndexedSource
    num_feeds = _Same()
    graph = _Same()
    label_dtype = _Same()
    output_spec = _Same()
    sample_nbytes = _Same()
    random = _Same()
    uses_gpu = _Same()
    outputs = _Same()
    assemble = _Same()
    recipe = _Same()
    check = _Same()

    def __new__(cls, source: IndexedSource, indices: Sequence[int] | np.ndarray) -> Subset:
        if cls is Subset:  # with the capabilities of its source
            cls = _subset_class(tuple(p for p in _VIEWS if isinstance(source, p)))
        return super().__new__(cls)

    def __init__(self, source: IndexedSource, indices: Sequence[int] | np.ndarray):
        self.source = source
        self.indices = np.asarray(indices, dtype=np.int64)
        self.scale = source.scale
        self.class_names = source.class_names
        self.augment = source.augment
        self.default_loss = source.default_loss
        self.feeds_shared = source.feeds_shared

    @property
    def num_samples(self) -> int:
        return len(self.indices)

    def feed(self, indices: np.ndarray) -> Sequence[Any]:
        return self.source.feed(self.indices[indices])

    def prepare(self, indices: np.ndarray) -> None:
        self.source.prepare(self.indices[indices])

    def locate(self, index: int) -> str:
        return self.source.locate(int(self.indices[index]))

    def describe(self) -> str:
        return f"{self.source.describe()} [{self.num_samples} of {self.source.num_samples}]"


# ------------------------------------------------------------------------------ validation_split
def held_out(source: Source, n: int, fraction: float) -> int:
    """How many of ``n`` samples ``validation_split=fraction`` holds out, as Keras counts:
    ``n - floor(n * (1 - fraction))`` for arrays (Keras' ``train_validation_split``), else
    ``int(n * fraction)`` (``image_dataset_from_directory``'s count of files). ``source`` may
    be the data's base (``base_of``), which this asks for otherwise."""
    if isinstance(base_of(source), InMemory):  # one array, or a dict or tuple of them
        return n - math.floor(n * (1.0 - fraction))
    return int(n * fraction)


def split_validation(source: Source, fraction: float, seed: int = 0) -> tuple[Subset, Subset]:
    """``(train, validation)``: a seeded random ``fraction`` of ``source`` held out.

    The split depends only on the number of samples, ``fraction`` and ``seed``: the same on
    every run, in every process and whatever the number of devices. Each part keeps the
    source's order (the loader shuffles the training part every epoch). Its sizes are
    Keras': of ``n`` files, ``int(n * fraction)`` are held out (``image_dataset_from_directory``);
    of ``n`` array rows, ``n - floor(n * (1 - fraction))`` (``fit(validation_split=)``), so a
    tiny fraction of arrays still validates on one row. Refused only when a side is empty.

    Args:
        source: an index-driven source (any but a reader-driven one such as an LMDB).
        fraction: the share held out for validation, in (0, 1).
        seed: seeds the permutation.

    Example:
        >>> import numpy as np, easyfit as ef
        >>> from easyfit.data.split import split_validation
        >>> data = ef.data.Arrays(np.arange(20.0)[:, None], np.arange(20) % 2)
        >>> train, val = split_validation(data, 0.1, seed=0)
        >>> len(train), len(val), set(train.indices) & set(val.indices)
        (18, 2, set())
        >>> [len(part) for part in split_validation(data, 0.001)]  # Keras: one row still held out
        [19, 1]
    """
    if not 0.0 < float(fraction) < 1.0:
        raise ValueError(f"validation_split={fraction!r}: expected a fraction in (0, 1)")
    if not isinstance(source, IndexedSource):  # a ReaderSource: DALI's reader picks the order
        raise ValueError(
            f"validation_split: {source.describe()} is read by DALI's reader in its "
            "own order, so easyfit cannot hold samples out of it; give validation "
            "data instead (validation_data=..., or a root/val beside root/train)"
        )
    n = source.num_samples
    held = held_out(source, n, float(fraction))
    if held < 1 or held >= n:
        raise ValueError(
            f"validation_split={fraction}: of {n} samples that leaves {n - held} "
            f"for training and {held} for validation; both need at least one"
        )
    order = np.random.default_rng([seed, 0x5A11D]).permutation(n)
    return Subset(source, np.sort(order[held:])), Subset(source, np.sort(order[:held]))


class _KnownLabelsOf:
    source: Any
    indices: np.ndarray

    def known_labels(self) -> Any:
        labels = self.source.known_labels()
        if isinstance(labels, dict):
            return {k: v[self.indices] for k, v in labels.items()}
        if isinstance(labels, tuple):
            return tuple(v[self.indices] for v in labels)
        return None if labels is None else labels[self.indices]


class _SampleChecksOf:
    source: Any
    indices: np.ndarray

    def sample_problem(self, index: int) -> str | None:
        return self.source.sample_problem(int(self.indices[index]))


class _EncodedSamplesOf:
    source: Any
    indices: np.ndarray

    def encoded_image(self, index: int) -> bytes | None:
        return self.source.encoded_image(int(self.indices[index]))


class _FedLabelsOf:
    limit_labels = _Same()


class _BlockedOf:
    source: Any
    indices: np.ndarray

    def shuffle_windows(self) -> Any:
        """The source's windows, over the kept samples (each in its block of the source)."""
        windows = self.source.shuffle_windows()
        return (
            None if windows is None else dataclasses.replace(windows, block_of=windows.block_of[self.indices])
        )


class _DecodedLabelsOf:
    decoded_label_limit = _Same()


#: The capabilities a Subset takes from its source, and how.
_VIEWS: dict[type, type] = {
    KnownLabels: _KnownLabelsOf,
    SampleChecks: _SampleChecksOf,
    EncodedSamples: _EncodedSamplesOf,
    FedLabels: _FedLabelsOf,
    DecodedLabels: _DecodedLabelsOf,
    Blocked: _BlockedOf,
}


@functools.cache
def _subset_class(capabilities: tuple[type, ...]) -> type[Subset]:
    """Subset with the members of ``capabilities`` (made once per combination)."""
    if not capabilities:
        return Subset
    mixins = tuple(_VIEWS[c] for c in capabilities)
    return cast("type[Subset]", type("Subset", (*mixins, Subset), {"__module__": __name__}))


#: Rows of an array source hashed for its fingerprint (evenly spaced; never the whole array).
_FINGERPRINT_ROWS = 64


def _fingerprint_hash(*parts: Any) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part if isinstance(part, bytes) else repr(part).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def data_fingerprint(source: Any) -> dict[str, Any]:
    """What identifies a training source, cheaply (no file is read): its kind, the number of
    samples, the class names, and a hash of its files' paths (relative to the folder they
    share) and sizes (and for record files, what their index read: each record's byte range or
    row group and label, in memory already), or for arrays of their shapes, dtypes and a few
    evenly spaced rows; a ``Subset`` (``validation_split``) adds the indices it keeps. A file
    rewritten with the same size, records and labels (only its images' bytes changed) is not
    told apart: that takes reading it. Recorded in backups, compared
    when a fit resumes (``ResumePoint.check_data``)."""
    base, indices = source, None
    while isinstance(base, View):  # a Subset of a source
        indices = np.asarray(base.indices) if indices is None else np.asarray(base.indices)[indices]
        base = base.source
    found: dict[str, Any] = {
        "kind": type(base).__name__,
        "samples": int(len(source)),
        "class_names": list(source.class_names) if source.class_names is not None else None,
    }
    files = base.files if isinstance(base, FileBacked) else None
    if isinstance(files, (list, tuple)) and files and all(isinstance(f, str) for f in files):
        storage = storage_of(files)  # in a bucket: sizes from its listing
        paths = [storage.absolute(f) for f in files]
        top = os.path.commonpath(paths)  # the folder above them, or the one file's
        top = top if len(set(paths)) > 1 else os.path.dirname(top)
        size = storage.size
        found["files"] = _fingerprint_hash(
            *((os.path.relpath(p, top), size(f)) for p, f in zip(paths, files))
        )
        if isinstance(base, RecordsLayout):  # record files: a rewrite of the same size moves records
            found["records"] = _fingerprint_hash(
                *(np.ascontiguousarray(a).tobytes() for a in base.records_layout())
            )
    elif isinstance(base, InMemory):
        import jax

        leaves = jax.tree_util.tree_leaves((base.x, base.y))
        rows: list[Any] = [
            np.unique(np.linspace(0, len(a) - 1, _FINGERPRINT_ROWS).astype(np.int64)) if len(a) else []
            for a in leaves
        ]
        found["arrays"] = _fingerprint_hash(
            *((a.shape, a.dtype.str) for a in leaves),
            *(np.ascontiguousarray(np.asarray(a)[r]).tobytes() for a, r in zip(leaves, rows, strict=False)),
        )
    if indices is not None:
        found["subset"] = _fingerprint_hash(np.ascontiguousarray(indices, dtype=np.int64).tobytes())
    return found
