"""Parquet whose images do not fit ``cache_bytes``: a shuffled pass reads windows of row groups
(row groups permuted, rows permuted within each window), each row group once per pass, in an
order that is a function of (seed, pass) only: the same after a resume, each sample once."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.data.plan import Plan
from tests.helpers import Crash, crash_before, flat_params
from tests.helpers.formats import encode, write_parquet
from tests.helpers.models import TinyMLP

pytest.importorskip("pyarrow.parquet")

#: 24 row groups of 4 rows, a cache of 16: windows of 4 row groups (16 rows: the window fed, and
#: those of the rows the pipeline has in hand and is told of ahead, fit the cache)
N, ROWS, HELD = 96, 4, 16
W = HELD // 4
SEED = 3


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> str:
    """96 noise images of 16x16 whose first pixel is 2 x their row (what the model sees)."""
    rng = np.random.default_rng(0)
    images = []
    for i in range(N):
        image = rng.integers(0, 255, (16, 16), np.uint8)
        image[0, 0] = 2 * i
        images.append(encode(image))
    path = tmp_path_factory.mktemp("pq") / "s.parquet"
    return write_parquet(path, images, np.arange(N) % 3, row_group_size=ROWS, struct=False)


def _source(path: str, held: int | None = HELD, **options) -> ef.data.Parquet:
    whole = ef.data.Parquet(path, image_size=(16, 16), color_mode="grayscale")
    cache = None if held is None else held * int(whole._group_bytes.max())
    return ef.data.Parquet(path, image_size=(16, 16), color_mode="grayscale", cache_bytes=cache, **options)


def _windows_of(order: np.ndarray, block_of: np.ndarray, size: int) -> list[set[int]]:
    """The row groups of each window, as ``order`` goes (a window's rows contiguous)."""
    blocks = block_of[order]
    _, first = np.unique(blocks, return_index=True)
    ordered = blocks[np.sort(first)]
    windows = [set(ordered[i : i + size].tolist()) for i in range(0, len(ordered), size)]
    at = 0
    for window in windows:  # each window's rows come before the next window's
        rows = int(np.isin(block_of, list(window)).sum())
        assert set(blocks[at : at + rows].tolist()) == window
        at += rows
    return windows


def test_windows_each_sample_once_a_window_of_row_groups_at_a_time_a_function_of_seed_and_pass(shard):
    source = _source(shard)
    windows = source.shuffle_windows()
    assert windows is not None and windows.size == W
    assert f"windows of {W} row groups (about {W * ROWS} rows)" in windows.note and shard in windows.note
    block_of = np.arange(N) // ROWS
    orders = [windows.order(SEED, p) for p in range(2)]
    for order in orders:
        assert sorted(order.tolist()) == list(range(N))
        assert len(_windows_of(order, block_of, W)) == N // ROWS // W
    assert not np.array_equal(orders[0], orders[1])  # a fresh order each pass...
    again = _source(shard).shuffle_windows()
    assert again == windows and np.array_equal(again.order(SEED, 1), orders[1])  # ...the same each run
    # the plan follows it; two devices take the rows of each batch: each sample once a pass
    plan = Plan(N, 8, shuffle=True, seed=SEED, num_shards=2, windows=windows)
    np.testing.assert_array_equal(plan.order(1), orders[1])
    rows = np.concatenate([plan.chunk(c)[0] for c in range(plan.steps_per_pass)])
    assert sorted(rows.tolist()) == list(range(N))
    # a backup records the windows: a resume with others (another cache_bytes) is refused
    from easyfit.persistence.checkpoint import ResumePoint, _plan_json

    saved = ResumePoint(1, 0, None, {"plan": _plan_json(plan)}, read=None)
    saved.check(plan)
    other = Plan(
        N, 8, shuffle=True, seed=SEED, num_shards=2, windows=_source(shard, held=12).shuffle_windows()
    )
    with pytest.raises(ValueError, match=r"batching changed \(shuffle windows \[size, blocks\]: \[4, "):
        saved.check(other)
    # validation_split: the training rows, windowed by the row groups they are in
    train, val = ef.data.split_validation(source, 0.25, seed=SEED)
    sub = train.shuffle_windows()
    assert sub is not None and sub.size == W
    order = sub.order(SEED, 0)
    assert sorted(order.tolist()) == list(range(train.num_samples))
    _windows_of(order, block_of[train.indices], W)
    # the choice: global, windows always, or windows when the images do not fit (they do here)
    assert _source(shard, shuffle="global").shuffle_windows() is None
    assert _source(shard, held=None).shuffle_windows() is None
    assert _source(shard, held=None, shuffle="row_groups").shuffle_windows().size == N // ROWS
    with pytest.raises(ValueError, match=r"ef.data.Parquet\(shuffle='batch'\): expected one of 'auto'"):
        _source(shard, shuffle="batch")


def test_fit_data_decides_the_windows_once_and_the_training_stream_follows_them(shard):
    inputs = ef.data.DataInputs(ef.parallel.Placement.create(), seed=SEED)
    try:
        data = inputs.fit_data(_source(shard), shuffle=True)
        assert data.windows is not None and data.windows.size == W
        stream, _ = inputs.train_loader(data, 4, shuffle=True, cache=False)
        try:
            assert stream.plan.windows is data.windows  # the one decision, agreed on and followed
        finally:
            stream.close()
        assert inputs.fit_data(_source(shard), shuffle=False).windows is None
    finally:
        inputs.close()


class _Recorder(ef.Trainer):
    """Records the row of each sample trained (its first pixel / 2), step by step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[np.ndarray] = []

    def _record(self, x, mask) -> None:
        self.seen.append(np.asarray(x)[np.asarray(mask).astype(bool)][:, 0, 0, 0].astype(int) // 2)

    def compute_loss(self, outputs, batch):
        jax.debug.callback(self._record, batch["x"], batch["mask"])
        return super().compute_loss(outputs, batch)


def _fit(source, callbacks=(), trainer=None, verbose=0):
    trainer = trainer or _Recorder(TinyMLP(), optimizer=optax.adam(1e-3), seed=SEED, steps_per_execution=1)
    trainer.fit(source, epochs=2, batch_size=4, cache=False, verbose=verbose, callbacks=list(callbacks))
    return trainer


def test_a_windowed_fit_reads_each_row_group_once_a_pass_says_so_once_and_resumes_exactly(
    shard, tmp_path, capsys
):
    from easyfit.callbacks import BackupAndRestore

    source = _source(shard)
    windows = source.shuffle_windows()
    source._groups.reads[:] = 0  # those read when it was built (its images' form) not counted
    full = _fit(source, verbose=1)
    said = capsys.readouterr().out
    assert said.count(f"windows of {W} row groups") == 1, said
    steps = N // 4
    assert len(full.seen) == 2 * steps
    for p in range(2):  # the samples of each epoch: the windows' order, each once
        seen = np.concatenate(full.seen[p * steps : (p + 1) * steps])
        np.testing.assert_array_equal(seen, windows.order(SEED, p))
    reads = source._groups.reads
    # each once a pass, and the next pass's first window read ahead once (the stream goes on)
    bound = 2 * N // ROWS + 2 * W
    assert (reads >= 1).all() and reads.sum() <= bound, reads
    # a permutation of all the rows, with the same cache, reads row groups again and again
    every = _source(shard, shuffle="global")
    every._groups.reads[:] = 0
    for p in range(2):
        for batch in ef.data.epoch_permutation(N, SEED, p).reshape(-1, 4):
            every.feed(batch)
    assert every._groups.reads.sum() > bound, every._groups.reads
    # interrupted in epoch 1 and resumed: the same samples from there, the same parameters
    crashing = _Recorder(TinyMLP(), optimizer=optax.adam(1e-3), seed=SEED, steps_per_execution=1)
    with pytest.raises(Crash):
        _fit(
            _source(shard),
            [BackupAndRestore(tmp_path / "b", save_freq=2), crash_before(crashing, 1, 5)],
            crashing,
        )
    resumed = _fit(_source(shard), [BackupAndRestore(tmp_path / "b", save_freq=2)])
    assert len(resumed.seen) == steps - 4  # from the backup of batch 4 of epoch 1
    for got, want in zip(resumed.seen, full.seen[-len(resumed.seen) :], strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(flat_params(resumed.params), flat_params(full.params))
