"""What both pipeline kinds share: DALI pipeline runs checked and converted, and the sizing
of pipelines, threads and runs.

The kinds themselves are :mod:`easyfit.data.fed_pipelines` (fed by the
:class:`~easyfit.data.plan.Plan`, for an index-fed source) and
:mod:`easyfit.data.reader_pipelines` (DALI's reader picks the order); which one a source gets is
chosen in :mod:`easyfit.data.kinds`. On GPU machines the pipelines run on the GPU
(``device_id``) only when the source decodes there, else on the host, and a chunk is copied to
the devices in one transfer. A pipeline's share of a chunk is prepared in runs of at most
:data:`RUN_ROWS` rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._env import available_cores
from ..errors import DataError
from ..parallel import Placement
from .augment import Augment
from .diagnose import batch_error, odd_shape_sample, outside_error, turned_sample
from .sources.base import IndexedSource, Source
from .sources.capabilities import DecodedLabels

__all__ = [
    "RUN_ROWS",
    "PipelineBuilder",
    "PipelineRunner",
    "default_num_threads",
    "on_gpu_pipelines",
    "run_rows",
    "shard_sizes",
]


def default_num_threads(platform: str, pipelines: int) -> int:
    """DALI worker threads per pipeline.

    On a CPU-only machine training itself needs the cores, so DALI gets half of them. On GPU
    machines each pipeline gets its share of the cores, capped at 8 (more does not help; see
    docs/performance.md).
    """
    cores = available_cores()
    if platform == "cpu":
        return max(1, cores // 2)
    return max(1, min(8, cores // max(1, pipelines)))


#: Most rows one pipeline run prepares: DALI's throughput falls steeply with larger batches
#: (docs/performance.md), so a pipeline's share of a chunk is prepared in several runs.
RUN_ROWS = 256


def run_rows(rows: int) -> int:
    """Rows of one run of a reader pipeline, which must split a chunk's ``rows`` evenly: their
    largest divisor up to :data:`RUN_ROWS`, or ``rows`` itself (one run) when that divisor is
    under ``RUN_ROWS // 8``, for which the runs would cost more than they save.

    Example:
        >>> from easyfit.data.pipelines import run_rows
        >>> run_rows(6000), run_rows(200), run_rows(514)
        (250, 200, 514)
    """
    best = max(d for d in range(1, min(rows, RUN_ROWS) + 1) if rows % d == 0)
    return best if best >= min(rows, RUN_ROWS // 8) else rows


def shard_sizes(num_samples: int, num_shards: int) -> np.ndarray:
    """Samples in each of DALI's shards: shard k is ``[k*n//s, (k+1)*n//s)``.

    Example:
        >>> from easyfit.data.pipelines import shard_sizes
        >>> shard_sizes(10, 3).tolist()
        [3, 3, 4]
    """
    bounds = np.arange(num_shards + 1, dtype=np.int64) * num_samples // num_shards
    return np.diff(bounds)


def on_gpu_pipelines(source: Source, placement: Placement) -> bool:
    """Whether the pipelines run on the GPUs (``device_id`` set, outputs in device memory).

    Only when the source runs operators there (``source.uses_gpu``: the GPU image decoder).
    Otherwise the pipelines run on the host and the chunk is copied to the devices in one
    transfer, which costs less than DALI's per-pipeline copies for small samples.
    """
    return placement.platform == "gpu" and source.uses_gpu


def augmented(source: Source, outputs: tuple[Any, ...], training: bool) -> tuple[Any, ...]:
    """The graph's outputs (``(x, y, ...)``) with a plain-function augmentation applied to
    ``x`` when training (an :class:`~easyfit.data.augment.Augment` is applied by the source's
    graph, with its draws)."""
    x, *rest = outputs
    if training and source.augment is not None and not isinstance(source.augment, Augment):
        x = source.augment(x)
    return (x, *rest)


def draws_of(source: Source, training: bool) -> Augment | None:
    """The source's Augment when its draws are wanted (training batches), else None."""
    return source.augment if training and isinstance(source.augment, Augment) else None


@dataclasses.dataclass(frozen=True)
class PipelineBuilder:
    """What every DALI pipeline of one stream is built with, and the building.

    Args:
        source: what the pipelines read.
        training: whether a plain-function augmentation applies (:func:`augmented`).
        threads: DALI worker threads per pipeline.
        prefetch: DALI's prefetch queue depth.
        checkpointing: whether DALI keeps the pipelines' checkpoints (reader pipelines).
    """

    source: Source
    training: bool
    threads: int
    prefetch: int
    checkpointing: bool = False

    def build(
        self,
        graph: Callable[[str], tuple[Any, ...]],
        *,
        batch: int,
        device_id: int | None,
        seed: int,
        checkpoint: bytes | None = None,
    ) -> Any:
        """A pipeline of ``batch`` samples a run, built, whose outputs are ``graph(device)``'s
        (``device``: ``"gpu"`` with a ``device_id``, else ``"cpu"``), augmented when training;
        ``checkpoint``, one of DALI's pipeline checkpoints, says where it starts."""
        from nvidia.dali import pipeline_def

        source, training = self.source, self.training
        where = "gpu" if device_id is not None else "cpu"

        # DALI's pipeline_def stub types device_id as int; its docs take None (CPU only)
        @pipeline_def(
            batch_size=batch,
            num_threads=self.threads,
            device_id=device_id,  # type: ignore[arg-type]
            seed=seed,
            prefetch_queue_depth=self.prefetch,
            enable_checkpointing=self.checkpointing,
        )
        def pipeline():
            return augmented(source, graph(where), training)

        pipe = pipeline(checkpoint=checkpoint) if checkpoint is not None else pipeline()
        pipe.build()
        return pipe


def pipeline_seed(seed: int, *key: int) -> int:
    """A DALI seed of its own for each pipeline (or reader shard), derived from the Trainer's
    seed: pipelines never repeat each other's random draws.

    Example:
        >>> from easyfit.data.pipelines import pipeline_seed
        >>> pipeline_seed(0, 0, 1) != pipeline_seed(0, 0, 2)
        True
    """
    return int(np.random.SeedSequence([seed, *key]).generate_state(1)[0] & 0x7FFFFFFF)


class PipelineRunner:
    """What both kinds do with one DALI pipeline run: outputs checked, converted and joined.

    Args:
        source: what the pipelines read.
        placement: the devices; the pipelines run on the GPUs when :func:`on_gpu_pipelines`
            says so (:attr:`on_gpu`: their outputs are then in device memory).
        find: names the bad sample of a failed run among the suspects the run gives (None
            when none is found).
        indexed: the suspects are sample indices of an
            :class:`~easyfit.data.sources.base.IndexedSource` (given by its pipelines): decoded
            labels and turned images are then traced back to their samples.
    """

    def __init__(
        self,
        source: Source,
        placement: Placement,
        find: Callable[[Iterable[int]], str | None],
        indexed: IndexedSource | None = None,
    ):
        self.source = source
        self.on_gpu = on_gpu_pipelines(source, placement)
        self._find = find
        self._indexed = indexed
        self._shapes: dict[str, tuple[int, ...]] = {}  # one sample's of each output, first run's

    def run(self, pipe: Any, suspects: Any) -> tuple[Any, ...]:
        """One run of ``pipe`` as ``(x, y)`` (or one array per name of ``source.outputs``); a
        failure becomes a DataError naming the bad sample among ``suspects()`` when one is found."""
        try:
            outs = pipe.run()
        except RuntimeError as e:
            raise batch_error(self.source, e, self._find(suspects())) from None
        names = self.source.outputs
        arrays = tuple(self.convert(pipe, o, name, suspects) for o, name in zip(outs, names, strict=True))
        for name, a in zip(names, arrays, strict=True):  # shapes only: nothing is computed
            usual = self._shapes.setdefault(name, tuple(a.shape[1:]))
            if tuple(a.shape[1:]) != usual:  # the steps were traced for the usual shape
                raise self._differ(name, usual, tuple(a.shape[1:]), suspects)
        limit = self.source.decoded_label_limit() if isinstance(self.source, DecodedLabels) else None
        if limit is not None and "y" in names and self._indexed is not None:
            y = arrays[names.index("y")]
            if bool(((y < 0) | (y >= limit)).any()):  # one reduction per batch (on its device)
                raise outside_error(self._indexed, suspects(), limit, np.asarray(y)) from None
        return arrays

    def convert(self, pipe: Any, out: Any, name: str, suspects: Any = list) -> Any:
        if not out.is_dense_tensor():
            shapes = [tuple(int(d) for d in out[i].shape()) for i in range(len(out))]
            usual = self._shapes.get(name) or max(shapes, key=shapes.count)  # earlier runs', or most
            raise self._differ(name, usual, next(s for s in shapes if s != usual), suspects)
        if not self.on_gpu:
            return out.as_array()
        array = jax.dlpack.from_dlpack(out.as_tensor())
        return array if pipe.exec_dynamic else array.copy()

    def _differ(self, name: str, a: tuple[int, ...], b: tuple[int, ...], suspects: Any) -> DataError:
        """The DataError for samples of output ``name`` of shape ``b`` where ``a`` was usual,
        naming the sample among ``suspects()`` that is decoded to another shape when one is."""
        why, turned, odd = "", None, None
        if len(a) == 3 and (a[1], a[0], a[2]) == b:  # height and width swapped
            turned = self._indexed is not None and turned_sample(self._indexed, suspects())
            why = "height and width swapped: " + (
                turned
                or "a photo with an EXIF orientation that turns it by a quarter (DALI applies "
                "it, as Pillow's exif_transpose does) is decoded turned"
            )
            why += ". "
        if not turned and self._indexed is not None:
            odd = odd_shape_sample(self._indexed, suspects(), self.source.outputs.index(name), a)
        return DataError(
            f"{self.source.describe()}: samples of {name} differ in shape ({a} and {b})"
            + (f": {odd}, not {a} as the others" if odd else "")
            + f"; {why}For images resize them all: ef.data.ImageFolder(path, image_size=(h, w)) (or "
            "the image_size= of the source you use)"
        )

    def join(self, runs: list[tuple[Any, ...]]) -> tuple[Any, ...]:
        """The ``(x, y, ...)`` outputs of consecutive runs of one pipeline, as one."""
        if len(runs) == 1:
            return runs[0]
        concatenate = jnp.concatenate if self.on_gpu else np.concatenate
        return tuple(concatenate(parts) for parts in zip(*runs, strict=True))
