"""The trainer's data inputs (the role of Keras' ``EpochIterator``): :class:`DataInputs`.

Given what the user passed (a path, arrays, a source, ``validation_split``, ``cache``) and the
placement, :class:`DataInputs` resolves sources (keeping one per path), splits off validation
data, plans the batches, decides caching, opens the training stream, lends evaluation and
prediction streams from one pass to the next, and closes them all. The trainer's ``fit``,
``evaluate`` and ``predict`` ask it for streams (:class:`~easyfit.data.stream.Stream`) and
iterate; the labels are checked by the trainer (``easyfit.training.checks``)."""

from __future__ import annotations

import dataclasses
import logging
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

from ..core.steps import per_dispatch
from ..parallel import Placement
from .kept_streams import KeptStreams, LentStream
from .loader import Resume, open_stream, stream_request
from .plan import Plan, Windows
from .resolve import Sources, TrainingData
from .sources.base import Blocked, FolderListing, Source, base_of
from .stream import LoaderOptions, Stream

__all__ = ["DataInputs", "TrainingData", "shuffle_windows"]


log = logging.getLogger("easyfit")

_DEFAULT_BATCH = 32  # Keras' and the Trainer's default batch_size


_Resume = Resume  # the name before; kept for a release


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
        >>> data = inputs.fit_data(np.zeros((10, 4, 4, 1), np.uint8), np.arange(10),
        ...                        validation_split=0.2)
        >>> len(data.train), len(data.validation)
        (8, 2)
        >>> with inputs.lease(data.validation, batch_size=2) as stream:
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
        self._sources = Sources()  # one per path, read alike the training data
        self._said: weakref.WeakSet[Source] = weakref.WeakSet()  # whose left_out was said
        self._kept = KeptStreams(placement, loader_options)

    @property
    def loader_options(self) -> LoaderOptions:
        """How the loaders run, for training and the kept streams alike."""
        return self._kept.options

    @loader_options.setter
    def loader_options(self, options: LoaderOptions | Mapping[str, Any]) -> None:
        self._kept.options = LoaderOptions.of(options)

    @property
    def recipe(self) -> dict[str, Any] | None:
        """The input recipe of the data the model was trained on (``Source.recipe()``): the
        last fit's training source's, or a loaded checkpoint's; None when unknown."""
        return self._sources.recipe

    @recipe.setter
    def recipe(self, recipe: dict[str, Any] | None) -> None:
        self._sources.recipe = recipe

    # ------------------------------------------------------------------------------ sources
    def fit_data(
        self,
        x: Any,
        y: Any = None,
        validation_data: Any = None,
        validation_split: float = 0.0,
        sample_weight: Any = None,
        folder_settings: Mapping[str, Any] | None = None,
        *,
        shuffle: bool | str = True,
        verbose: bool = False,
    ) -> TrainingData:
        """fit's data (:class:`TrainingData`) from its arguments, resolved in one pass by
        ``easyfit.data.resolve.Sources.training_data`` (which says what each argument may be),
        with what fit reads of its sources decided once there; added here, the windows a pass
        shuffled as ``shuffle`` reads and, with ``verbose``, what the listings left out (each
        said once)."""
        data = self._sources.training_data(
            x,
            y,
            validation_data,
            validation_split,
            sample_weight,
            folder_settings,
            seed=self.seed,
            verbose=verbose,
        )
        windows = shuffle_windows(data.train, shuffle)
        notes = tuple(self.left_out(data.base, data.validation)) if verbose else ()
        return dataclasses.replace(data, windows=windows, left_out=notes)

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
        return self._sources.kept_source(data, y, sample_weight, inputs_only=inputs_only, argument=argument)

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
        self._sources.close()


def shuffle_windows(source: Source, shuffle: bool | str, cached: bool = False) -> Windows | None:
    """The windows a shuffled pass over ``source`` reads its blocks in (``Blocked``), or
    None: a permutation of all the samples (not shuffled, ``shuffle="batch"``, or cached on
    the devices, where any order costs the same)."""
    if isinstance(shuffle, str) or not shuffle or cached or not isinstance(source, Blocked):
        return None
    return source.shuffle_windows()
