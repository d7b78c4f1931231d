"""Sample order: a pure function of (seed, epoch), the same in every process.

Every global batch is a slice of one permutation of the dataset's indices. Devices take
consecutive rows of each global batch, so 1 process x 4 devices and 2 processes x 2 devices see
the same batches, and resuming needs nothing but the position in the stream.

The stream is cut into *chunks*: ``steps_per_execution`` consecutive steps that run in one
dispatch. An epoch always ends on a chunk boundary; steps of the last chunk that fall past the end
of the epoch are fully masked (and the train step skips them).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["Plan", "epoch_permutation"]


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the samples in one epoch.

    Example:
        >>> from easyfit.data.order import epoch_permutation
        >>> p = epoch_permutation(5, seed=0, epoch=0)
        >>> sorted(p.tolist()) == [0, 1, 2, 3, 4]
        True
        >>> bool((p == epoch_permutation(5, seed=0, epoch=0)).all())
        True
    """
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(num_samples)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Which samples make up each chunk of the stream.

    Attributes:
        num_samples: samples in the dataset.
        batch_size: global batch size (all devices, all processes).
        shuffle: a new permutation every epoch, or the source's own order.
        seed: seed of the permutations.
        steps_per_execution: steps per chunk.
        num_shards: devices the global batch is split over (in mesh order).

    Example:
        >>> from easyfit.data.order import Plan
        >>> plan = Plan(num_samples=5, batch_size=2, shuffle=False)
        >>> plan.steps_per_epoch
        3
        >>> idx, mask = plan.chunk(2)
        >>> idx.tolist(), mask.tolist()
        ([4, 0], [True, False])
    """

    num_samples: int
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    steps_per_execution: int = 1
    num_shards: int = 1

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.num_samples / self.batch_size)

    @property
    def chunks_per_epoch(self) -> int:
        return math.ceil(self.steps_per_epoch / self.steps_per_execution)

    @property
    def rows_per_shard(self) -> int:
        """Rows of one chunk that one device receives (steps_per_execution x per-device batch)."""
        return self.steps_per_execution * self.batch_size // self.num_shards

    def order(self, epoch: int) -> np.ndarray:
        if self.shuffle:
            return epoch_permutation(self.num_samples, self.seed, epoch)
        return np.arange(self.num_samples)

    def chunk(self, iteration: int, order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Sample indices and validity mask of one chunk, laid out shard-major.

        The flat result has ``steps_per_execution * batch_size`` rows: first all the rows of
        shard 0 (its slice of step 0, then of step 1, ...), then those of shard 1, and so on, so
        that each device's rows are contiguous.
        """
        epoch, c = divmod(iteration, self.chunks_per_epoch)
        if order is None:
            order = self.order(epoch)
        k, b, n = self.steps_per_execution, self.batch_size, self.num_samples
        pos = (c * k * b + np.arange(k * b)).reshape(k, self.num_shards, b // self.num_shards)
        mask = pos < n
        idx = np.where(mask, order[np.minimum(pos, n - 1)], order[0])
        return idx.swapaxes(0, 1).reshape(-1), mask.swapaxes(0, 1).reshape(-1)

    def epoch_of(self, iteration: int) -> int:
        return iteration // self.chunks_per_epoch
