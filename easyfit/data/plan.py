"""Sample order: a pure function of (seed, data pass), the same in every process.

The stream of steps is the concatenation of *data passes*: pass ``p`` is one permutation of the
dataset's indices (a fresh one per pass), cut into ``ceil(num_samples / batch_size)`` global
batches, the last one padded with masked rows. Devices take consecutive rows of each global
batch, so 1 process x 4 devices and 2 processes x 2 devices see the same batches, and resuming
needs nothing but the position in the stream.

An *epoch* is one pass, or ``steps_per_epoch`` steps of the stream when fit is given it: then
epoch ``e`` runs steps ``[e * steps_per_epoch, (e + 1) * steps_per_epoch)`` of the same stream,
so an epoch starts where the last one stopped and crosses into the next pass as Keras does with
a repeating dataset. Epoch boundaries move; the sequence of batches does not.

The stream is cut into *chunks*: ``steps_per_execution`` consecutive steps that run in one
dispatch. An epoch always ends on a chunk boundary; steps of the last chunk that fall past the end
of the epoch are fully masked (the training function of that chunk runs only the steps before
them: ``easyfit.core.steps.compile_train``), and the next epoch goes on with the step that follows
the last one trained.

A shuffled pass of a source stored in *blocks* read whole (Parquet's row groups) that do not all
fit the source's cache follows :class:`Windows`: the blocks permuted, cut into windows of as many
blocks as the cache holds, the samples permuted within each window, so that each block is read
once per pass. The order is still a pure function of (seed, pass, sample).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import threading

import numpy as np

__all__ = ["Orders", "Plan", "Windows", "epoch_permutation"]


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the samples in one data pass (``epoch``: the pass's index, which is the
    epoch's unless fit is given ``steps_per_epoch``).

    Example:
        >>> from easyfit.data.plan import epoch_permutation
        >>> p = epoch_permutation(5, seed=0, epoch=0)
        >>> sorted(p.tolist()) == [0, 1, 2, 3, 4]
        True
        >>> bool((p == epoch_permutation(5, seed=0, epoch=0)).all())
        True
    """
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(num_samples)


@dataclasses.dataclass(frozen=True, eq=False)
class Windows:
    """A shuffle of a source stored in blocks that are read whole (Parquet's row groups) when
    its cache holds only ``size`` of them: each pass permutes the blocks, cuts them into windows
    of ``size`` blocks and permutes the samples within each window, so that each block is read
    once per pass (Keras' ``shuffle="batch"`` for HDF5, petastorm's and WebDataset's row-group
    shuffles do the same). A function of (seed, pass) only, as every order.

    Attributes:
        block_of: the block of each sample (any integers; the samples of a block need not be
            contiguous: a ``Subset``'s are its source's).
        size: blocks per window (at least 1).
        note: what a fit says of it (the source's words: which source, its blocks' name).

    Example:
        >>> import numpy as np
        >>> from easyfit.data.plan import Windows
        >>> w = Windows(np.repeat(np.arange(4), 3), size=2)  # 4 blocks of 3 samples
        >>> order = w.order(seed=0, data_pass=0)
        >>> sorted(order.tolist()) == list(range(12))
        True
        >>> [len({int(b) for b in w.block_of[order[i : i + 6]]}) for i in (0, 6)]  # 2 blocks each
        [2, 2]
    """

    block_of: np.ndarray
    size: int
    note: str = ""
    _digest: str = dataclasses.field(default="", init=False, repr=False)
    _block: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.int64), init=False, repr=False
    )
    _blocks: int = dataclasses.field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_of", np.asarray(self.block_of, np.int64))
        object.__setattr__(self, "size", max(1, int(self.size)))
        digest = hashlib.sha256(np.ascontiguousarray(self.block_of).tobytes()).hexdigest()[:16]
        object.__setattr__(self, "_digest", digest)
        blocks, block = np.unique(self.block_of, return_inverse=True)
        object.__setattr__(self, "_block", block.reshape(-1))  # each sample's block, 0...
        object.__setattr__(self, "_blocks", len(blocks))

    def order(self, seed: int, data_pass: int) -> np.ndarray:
        """The order of the samples in pass ``data_pass``: window after window."""
        rng = np.random.default_rng([seed, data_pass, 0x817D])
        windows = rng.permutation(self._blocks) // self.size
        window = windows.astype(np.min_scalar_type(self._blocks))[self._block]  # small: a radix sort
        shuffled = rng.permutation(len(self.block_of))
        return shuffled[np.argsort(window[shuffled], kind="stable")]

    def key(self) -> list:
        """``[size, a hash of block_of]``: what a backup records of it (JSON), and compares."""
        return [self.size, self._digest]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Windows) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(tuple(self.key()))


@dataclasses.dataclass(frozen=True)
class Plan:
    """Which samples make up each chunk of the stream.

    Attributes:
        num_samples: samples in the dataset.
        batch_size: global batch size (all devices, all processes).
        shuffle: a new permutation every data pass (True), the source's own order (False),
            or ``"batch"``: the batches of the source's order, each batch's samples permuted
            afresh every pass (Keras' ``shuffle="batch"``).
        seed: seed of the permutations.
        steps_per_execution: steps per chunk.
        num_shards: devices the global batch is split over (in mesh order).
        epoch_steps: steps per epoch (fit's ``steps_per_epoch``); None: an epoch is one pass.
        windows: a shuffled pass's order is window after window of the source's blocks
            (:class:`Windows`) rather than a permutation of all the samples; None: the latter.

    Example:
        >>> from easyfit.data.plan import Plan
        >>> plan = Plan(num_samples=5, batch_size=2, shuffle=False)
        >>> plan.steps_per_epoch
        3
        >>> idx, mask = plan.chunk(2)
        >>> idx.tolist(), mask.tolist()
        ([4, 0], [True, False])

        With ``epoch_steps``, epochs cut the same stream of batches elsewhere: epoch 1 goes on
        with the pass epoch 0 stopped in, then the next one.

        >>> plan = Plan(num_samples=5, batch_size=2, shuffle=False, epoch_steps=2)
        >>> [plan.chunk(i)[0].tolist() for i in range(4)]  # epochs 0 and 1
        [[0, 1], [2, 3], [4, 0], [0, 1]]
    """

    num_samples: int
    batch_size: int
    shuffle: bool | str = True
    seed: int = 0
    steps_per_execution: int = 1
    num_shards: int = 1
    epoch_steps: int | None = None
    windows: Windows | None = None

    @property
    def steps_per_pass(self) -> int:
        """Steps of one pass over the data (the last one partly masked)."""
        return math.ceil(self.num_samples / self.batch_size)

    @property
    def steps_per_epoch(self) -> int:
        return self.epoch_steps or self.steps_per_pass

    @property
    def chunks_per_epoch(self) -> int:
        return math.ceil(self.steps_per_epoch / self.steps_per_execution)

    @property
    def rows_per_shard(self) -> int:
        """Rows of one chunk that one device receives (steps_per_execution x per-device batch)."""
        return self.steps_per_execution * self.batch_size // self.num_shards

    def order(self, data_pass: int) -> np.ndarray:
        """The order of the samples in pass ``data_pass``.

        Example:
            >>> from easyfit.data.plan import Plan
            >>> order = Plan(num_samples=7, batch_size=3, shuffle="batch").order(0)
            >>> [sorted(order[i : i + 3].tolist()) for i in range(0, 7, 3)]
            [[0, 1, 2], [3, 4, 5], [6]]
        """
        if self.shuffle == "batch":  # each batch of the source's order permuted in place
            keys = np.random.default_rng([self.seed, data_pass, 0xBA7C]).random(self.num_samples)
            return np.lexsort((keys, np.arange(self.num_samples) // self.batch_size))
        if self.shuffle and self.windows is not None:
            return self.windows.order(self.seed, data_pass)
        if self.shuffle:
            return epoch_permutation(self.num_samples, self.seed, data_pass)
        return np.arange(self.num_samples)

    def live_steps(self, batch: int) -> int:
        """Steps trained in chunk ``batch`` of an epoch: ``steps_per_execution``, but fewer in
        an epoch's last chunk when the steps do not divide evenly.

        Example:
            >>> from easyfit.data.plan import Plan
            >>> plan = Plan(num_samples=11, batch_size=2, steps_per_execution=4)  # 6 steps
            >>> [plan.live_steps(c) for c in range(plan.chunks_per_epoch)]
            [4, 2]
        """
        k = self.steps_per_execution
        return min(k, self.steps_per_epoch - batch % self.chunks_per_epoch * k)

    def steps(self, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        """The stream's step index of each of chunk ``iteration``'s steps, and which of them are
        trained (the tail of an epoch's last chunk is not; it repeats the epoch's last step)."""
        epoch, c = divmod(iteration, self.chunks_per_epoch)
        t = c * self.steps_per_execution + np.arange(self.steps_per_execution)
        n = self.steps_per_epoch
        return epoch * n + np.minimum(t, n - 1), t < n

    def passes(self, iteration: int) -> np.ndarray:
        """The data pass of each row of chunk ``iteration`` (laid out as :meth:`chunk`)."""
        return self._layout(iteration)[0]

    def _layout(self, iteration: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(pass, position in the pass, valid)`` of each row, flat and shard-major."""
        steps, live = self.steps(iteration)
        k, b, s = self.steps_per_execution, self.batch_size, self.num_shards
        data_pass, j = np.divmod(steps, self.steps_per_pass)
        pos = j[:, None] * b + np.arange(b)
        mask = live[:, None] & (pos < self.num_samples)

        def shard_major(a: np.ndarray) -> np.ndarray:
            return a.reshape(k, s, b // s).swapaxes(0, 1).reshape(-1)

        return shard_major(np.broadcast_to(data_pass[:, None], (k, b))), shard_major(pos), shard_major(mask)

    def chunk(self, iteration: int, orders: Orders | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Sample indices and validity mask of one chunk, laid out shard-major.

        The flat result has ``steps_per_execution * batch_size`` rows: first all the rows of
        shard 0 (its slice of step 0, then of step 1, ...), then those of shard 1, and so on, so
        that each device's rows are contiguous. A masked row holds its pass's first sample.
        ``orders``: the permutations, kept between calls (default: computed here).
        """
        orders = Orders(self) if orders is None else orders
        data_pass, pos, mask = self._layout(iteration)
        n = self.num_samples
        idx = np.empty(len(pos), np.int64)
        for p in np.unique(data_pass):
            rows = data_pass == p
            order = orders(int(p))
            idx[rows] = np.where(mask[rows], order[np.minimum(pos[rows], n - 1)], order[0])
        return idx, mask


class Orders:
    """A plan's permutations, the latest few kept (a chunk reads one pass, or two where it
    crosses from one into the next); safe to share between threads.

    Example:
        >>> from easyfit.data.plan import Orders, Plan
        >>> orders = Orders(Plan(num_samples=4, batch_size=2, seed=1))
        >>> sorted(orders(3).tolist())
        [0, 1, 2, 3]
    """

    KEEP = 3

    def __init__(self, plan: Plan):
        self.plan = plan
        self._kept: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def __call__(self, data_pass: int) -> np.ndarray:
        with self._lock:
            order = self._kept.get(data_pass)
            if order is None:
                order = self._kept[data_pass] = self.plan.order(data_pass)
                while len(self._kept) > self.KEEP:
                    del self._kept[min(self._kept)]
            return order
