"""The trainer's data inputs (the role of Keras' ``EpochIterator``): :class:`DataInputs`.

Given what the user passed (a path, arrays, a source, ``validation_split``, ``cache``) and the
placement, :class:`DataInputs` resolves sources (keeping one per path), splits off validation
data, plans the batches, decides caching, opens the training stream, lends evaluation and
prediction streams from one pass to the next, and closes them all. The trainer's ``fit``,
``evaluate`` and ``predict`` ask it for streams (:class:`~easyfit.data.stream.Stream`) and
iterate; the labels are checked by the trainer (``easyfit.training.labels``)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

from ..core.steps import per_dispatch
from ..parallel import Placement
from .fingerprint import data_fingerprint
from .kept_streams import KeptStreams, LentStream
from .loader import Resume, open_stream, stream_request
from .plan import Plan, Windows
from .resolve import image_files_for, source_for, split_layout
from .sources.arrays import unscaled_note
from .sources.base import Source
from .sources.capabilities import Blocked, FolderListing, base_of, known_labels
from .split import split_validation
from .stream import LoaderOptions, Stream

__all__ = ["DataInputs", "TrainingData", "shuffle_windows"]


log = logging.getLogger("easyfit")

_DEFAULT_BATCH = 32  # Keras' and the Trainer's default batch_size


_Resume = Resume  # the name before; kept for a release


@dataclasses.dataclass(frozen=True)
class TrainingData:
    """fit's data, resolved once (:meth:`DataInputs.fit_data`): the sources and the facts fit
    reads of them, computed here once, so that the trainer reads plain facts and nothing
    downstream asks the sources again.

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
            words (each said once: :meth:`DataInputs.left_out`), for a verbose fit.
        unscaled: for a verbose fit, a sentence when the training data is integer pixels given
            unscaled (``easyfit.data.sources.arrays.unscaled_note``), else None.
    """

    train: Source
    validation: Source | None
    scale: float | None
    class_names: list[str] | None
    labels_known: bool
    windows: Windows | None
    left_out: tuple[str, ...] = ()
    unscaled: str | None = None

    @functools.cached_property
    def fingerprint(self) -> dict[str, Any]:
        """What identifies the training data (``easyfit.data.fingerprint.data_fingerprint``),
        worked out when first asked (a backup records it, several processes compare it: it
        lists every file's size) and kept for the fit."""
        return data_fingerprint(self.train)

    @functools.cached_property
    def validation_fingerprint(self) -> dict[str, Any] | None:
        """What identifies the validation data, as :attr:`fingerprint`; None without any."""
        return None if self.validation is None else data_fingerprint(self.validation)


class DataInputs:
    """Everything a trainer needs from data, behind one object.

    Args:
        placement: the devices.
        seed: seeds shuffling and ``validation_split``.
        steps_per_execution: ``"auto"`` or optimizer steps per dispatch.
        loader_options: how the loaders run (:class:`~easyfit.data.stream.LoaderOptions`, or
            a mapping of its fields: ``num_threads``, ``pipelines_per_device``...).

    Example:
        >>> import numpy as np, easyfit as ef
        >>> inputs = ef.data.DataInputs(ef.parallel.Placement.create(), seed=0)
        >>> train, val = inputs.fit_sources(np.zeros((10, 4, 4, 1), np.uint8), np.arange(10),
        ...                                 validation_split=0.2)
        >>> len(train), len(val)
        (8, 2)
        >>> with inputs.lease(val, batch_size=2) as stream:
        ...     sorted(next(stream))
        ['mask', 'x', 'y']
        >>> inputs.close()
    """

    def __init__(
        self,
        placement: Placement,
        seed: int = 0,
        steps_per_execution: int | str = "auto",
        loader_options: LoaderOptions | Mapping[str, Any] | None = None,
    ):
        self.placement = placement
        self.seed = seed
        self.steps_per_execution = steps_per_execution
        self.cache: bool | str = "auto"  # the last fit's choice, also for evaluation data
        self._train: Source | None = None
        #: The input recipe of the data the model was trained on (``Source.recipe()``): the
        #: last fit's training source's, or a loaded checkpoint's; None when unknown.
        self.recipe: dict[str, Any] | None = None
        self._sources: dict[tuple[str, bool, str | None], Source] = {}
        self._said: weakref.WeakSet[Source] = weakref.WeakSet()  # whose left_out was said
        self._kept = KeptStreams(placement, loader_options)

    @property
    def loader_options(self) -> LoaderOptions:
        """How the loaders run, for training and the kept streams alike."""
        return self._kept.options

    @loader_options.setter
    def loader_options(self, options: LoaderOptions | Mapping[str, Any]) -> None:
        self._kept.options = LoaderOptions.of(options)

    # ------------------------------------------------------------------------------ sources
    def fit_data(
        self, *args: Any, shuffle: bool | str = True, verbose: bool = False, **kwargs: Any
    ) -> TrainingData:
        """fit's data (:class:`TrainingData`) from its arguments (those of :meth:`fit_sources`),
        with what fit reads of its sources decided once here: the windows a pass shuffled as
        ``shuffle`` reads, and with ``verbose`` the notes fit says."""
        train, val = self.fit_sources(*args, **kwargs)
        return TrainingData(
            train,
            val,
            scale=train.scale,
            class_names=train.class_names,
            labels_known=known_labels(train) is not None,
            windows=shuffle_windows(train, shuffle),
            left_out=tuple(self.left_out(train, val)) if verbose else (),
            unscaled=unscaled_note(train) if verbose else None,
        )

    def fit_sources(
        self,
        x: Any,
        y: Any = None,
        validation_data: Any = None,
        validation_split: float = 0.0,
        sample_weight: Any = None,
        folder_settings: Mapping[str, Any] | None = None,
    ) -> tuple[Source, Source | None]:
        """``(train, validation or None)`` from fit's arguments: a ``root/train`` + ``root/val``
        layout, ``validation_split`` held out, or ``validation_data`` (a source, a path,
        ``(x, y)`` or ``(x, y, sample_weight)``). ``folder_settings``: image settings for a
        training path read as an image folder (a pretrained model's preprocessing); the
        validation folder shares the training folder's settings."""
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
        train = self._resolve(x, y, like=None, sample_weight=sample_weight, folder_settings=folder_settings)
        if validation_split and validation_data is None:
            train, validation_data = split_validation(train, validation_split, self.seed)
        self._train = train
        self.recipe = train.recipe()
        if validation_data is not None:
            if isinstance(validation_data, tuple) and len(validation_data) in (2, 3):
                return train, self._alike(*validation_data, argument="validation_data")
            return train, self._alike(validation_data, argument="validation_data")
        return train, (self._alike(val_path) if val_path else None)

    def source(
        self,
        data: Any,
        y: Any = None,
        sample_weight: Any = None,
        *,
        inputs_only: bool = False,
        argument: str = "x",
    ) -> Source:
        """The source for ``data`` (the same one for the same path), with the training data's
        settings (image size, color mode, ...) when of the same format, else read as the
        :attr:`recipe` says. ``inputs_only``: for prediction (a tuple is a tuple of inputs, not
        ``(x, y)``, and images without labels are read as files); ``argument`` names it in
        errors."""
        key = self._key(data, sample_weight, inputs_only, None)
        if inputs_only and key not in self._sources:  # prediction's images without labels
            images = image_files_for(
                data, self._train, self.recipe, argument=argument, sample_weight=sample_weight
            )
            if images is not None:
                if key is not None:
                    self._sources[key] = images
                return images
        return self._alike(data, y, sample_weight, inputs_only=inputs_only, argument=argument)

    def _alike(self, data: Any, y: Any = None, sample_weight: Any = None, **options: Any) -> Source:
        """The source for ``data`` read as the training data, or the recipe, says (``options``:
        ``inputs_only``, ``argument``): :meth:`source` for all but prediction's images without
        labels, and the validation data."""
        return self._resolve(data, y, self._train, sample_weight=sample_weight, recipe=self.recipe, **options)

    def use_recipe(self, recipe: dict[str, Any] | None) -> None:
        """Reads data from now on as ``recipe`` says (a loaded model's): the sources resolved
        before, read otherwise, are closed and forgotten."""
        self.close()
        self.recipe = None if recipe is None else dict(recipe)

    def adopt(self, source: Source) -> None:
        """Takes ``source``'s recipe when none is known yet (a model built by evaluate or
        predict, never fit)."""
        if self.recipe is None:
            self.recipe = source.recipe()

    def _resolve(
        self,
        data: Any,
        y: Any,
        like: Source | None,
        sample_weight: Any = None,
        inputs_only: bool = False,
        argument: str = "x",
        recipe: dict[str, Any] | None = None,
        folder_settings: Mapping[str, Any] | None = None,
    ) -> Source:
        key = self._key(data, sample_weight, inputs_only, folder_settings)
        source = None if key is None or y is not None else self._sources.get(key)
        if source is None:  # (a path with y is refused there: its labels come from its data)
            source = source_for(data, y, like, argument, sample_weight, inputs_only, recipe, folder_settings)
            if key is not None:
                self._sources[key] = source
        if not inputs_only and not source.labelled:
            raise ValueError(f"{argument}: {source.describe()} has no labels: predict reads it")
        return source

    @staticmethod
    def _key(
        data: Any, sample_weight: Any, inputs_only: bool, folder_settings: Mapping[str, Any] | None
    ) -> tuple[str, bool, str | None] | None:
        """What a source of ``data`` is kept under (one per path, read as inputs only or not and
        with a pretrained model's settings or not), or None when it is not kept."""
        if not isinstance(data, (str, os.PathLike)) or sample_weight is not None:
            return None
        settings = None if folder_settings is None else repr(sorted(folder_settings.items()))
        return (os.path.abspath(os.fspath(data)), inputs_only, settings)

    def left_out(self, *sources: Source | None) -> list[str]:
        """What the listing of each of ``sources`` left out of its folder (hidden entries, files
        of other types, files beside the class folders...), in words, each said once: the
        sentences not returned before."""
        said: list[str] = []
        for source in sources:
            base = None if source is None else base_of(source)
            note = base.left_out if isinstance(base, FolderListing) else None
            if base is not None and note and base not in self._said:
                self._said.add(base)
                said.append(note)
        return said

    # ---------------------------------------------------------------------------- batching
    def plan(
        self,
        source: Source,
        batch_size: int,
        shuffle: bool | str,
        cached: bool = False,
        steps_per_epoch: int | None = None,
        training: bool = False,
        windows: Windows | None = None,
    ) -> Plan:
        """The batching plan (steps per dispatch: ``easyfit.core.steps.per_dispatch``); an epoch is
        ``steps_per_epoch`` steps of the stream, or one pass over ``source`` (None). A
        ``batch_size`` larger than the samples is clamped to them (see :meth:`_clamped`; a
        warning for the ``training`` data). ``windows``: those a shuffled pass reads the
        source's blocks in (:func:`shuffle_windows`, decided by the caller), unless ``cached``
        on the devices, where any order costs the same."""
        self.placement.check_batch_size(batch_size)
        batch_size = self._clamped(source, batch_size, warn=training)
        epoch_steps = None if steps_per_epoch is None else int(steps_per_epoch)
        k = per_dispatch(
            self.steps_per_execution,
            source.num_samples,
            batch_size,
            self.placement.platform,
            cached,
            epoch_steps=epoch_steps,
        )
        return Plan(
            source.num_samples,
            batch_size,
            shuffle=shuffle,
            seed=self.seed,
            steps_per_execution=k,
            num_shards=self.placement.num_shards,
            epoch_steps=epoch_steps,
            windows=None if cached else windows,
        )

    def _clamped(self, source: Source, batch_size: int, warn: bool) -> int:
        """``batch_size``, or all of ``source``'s samples (rounded up to a multiple of the
        devices) when it is larger: as in Keras, such a batch holds every sample once, and a
        padded batch of the size asked for would only cost memory and time (``batch_size=10**8``
        would never finish a step). Said in the log, and with ``warn`` as a UserWarning
        (unless ``batch_size`` is no more than the default 32, which a user need not choose)."""
        n, shards = source.num_samples, self.placement.num_shards
        clamped = -(-n // shards) * shards
        if batch_size <= clamped:
            return batch_size
        message = (
            f"batch_size={batch_size} is larger than the {n} samples of {source.describe()}: "
            f"batches of {clamped} are used (every sample once, as in Keras); pass "
            f"batch_size={clamped} or less to silence this"
        )
        log.info("easyfit: %s", message)
        if warn and batch_size > _DEFAULT_BATCH:  # the default is no choice of the user's
            warnings.warn(message, UserWarning, stacklevel=5)
        return clamped

    def train_loader(
        self,
        data: TrainingData | Source,
        batch_size: int,
        *,
        shuffle: bool | str = True,
        cache: bool | str = "auto",
        initial_epoch: int = 0,
        resume: Resume | None = None,
        steps_per_epoch: int | None = None,
    ) -> tuple[Stream, str]:
        """The training stream of ``data`` (:class:`TrainingData`, its shuffle's windows as
        decided there; or a training source), and a sentence saying whether it caches and why.

        With ``resume``, its plan is checked against the saved one and the stream starts at
        its position; else at ``initial_epoch``. ``steps_per_epoch``: an epoch of that many
        steps of the stream (None: one pass). The stream's plan is fixed before it opens. The
        caller closes the stream.
        """
        if isinstance(data, TrainingData):
            source, windows = data.train, data.windows
        else:
            source, windows = data, shuffle_windows(data, shuffle)

        def plan(cached: bool) -> Plan:
            return self.plan(
                source,
                batch_size,
                shuffle,
                cached=cached,
                steps_per_epoch=steps_per_epoch,
                training=True,
                windows=windows,
            )

        request = stream_request(
            source,
            plan,
            self.placement,
            cache=cache,
            options=self.loader_options,
            training=True,
            initial_epoch=initial_epoch,
            resume=resume,
        )
        self.cache = cache
        log.info("easyfit: %s", request.why)
        return open_stream(request, self.loader_options), request.why

    def lease(self, source: Source, batch_size: int, steps: int | None = None) -> LentStream:
        """A stream for one pass over ``source`` in order (evaluation, prediction), kept for
        the next pass; use it as a context manager. ``steps``: only the pass's first that many
        batches (Keras' ``steps`` and ``validation_steps``), streamed afresh each time so that
        every such pass starts at the first batch; None, or as many as the pass has, for all."""
        plan = self.plan(source, batch_size, shuffle=False)
        if steps is None or steps >= plan.steps_per_pass:
            return self._kept.lease(source, plan, self.cache)
        plan = self.plan(source, batch_size, shuffle=False, steps_per_epoch=steps)
        return self._kept.lease(source, plan, False, keep=False)

    def close(self) -> None:
        """Releases every kept stream (DALI pipelines, device caches) and open file."""
        self._kept.close()
        for source in self._sources.values():
            source.close()
        self._sources.clear()
        self._train = None


def shuffle_windows(source: Source, shuffle: bool | str, cached: bool = False) -> Windows | None:
    """The windows a shuffled pass over ``source`` reads its blocks in (``Blocked``), or None: a
    permutation of all the samples (not shuffled, ``shuffle="batch"``, or cached on the devices,
    where any order costs the same)."""
    if isinstance(shuffle, str) or not shuffle or cached or not isinstance(source, Blocked):
        return None
    return source.shuffle_windows()
