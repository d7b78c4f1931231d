"""Device-cached training: the same samples in the same steps as streaming, from device memory."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.data import cache
from easyfit.data.cache import chunks_to_cover
from easyfit.data.loader import decide_cache, open_stream
from easyfit.data.plan import Orders, Plan
from easyfit.parallel import Placement
from tests.helpers import flat_params
from tests.helpers.models import SmallMLP


def _fit(root, cache, epochs=3):
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0, steps_per_execution=5)
    history = trainer.fit(root, epochs=epochs, batch_size=100, verbose=0, cache=cache)
    return trainer, history


def test_cached_training_equals_streaming_bit_for_bit(mnist_dir, monkeypatch):
    monkeypatch.setattr(cache, "BLOCK_BYTES", 1 << 22)  # the recording in several blocks
    streamed, h1 = _fit(mnist_dir, cache=False)
    cached, h2 = _fit(mnist_dir, cache=True)
    assert np.array_equal(flat_params(streamed.params), flat_params(cached.params))
    h1.history.pop("input_wait")  # a timing, not a result
    h2.history.pop("input_wait")
    assert h1.history == h2.history


def test_auto_caches_what_fits_and_streams_what_does_not(mnist_dir):
    placement = Placement.create()
    folder = ef.data.ImageFolder(mnist_dir + "/train")
    assert decide_cache("auto", folder, placement)[0]
    assert not decide_cache(False, folder, placement)[0]
    huge = ef.data.ImageFolder(mnist_dir + "/train", image_size=(30_000, 30_000))
    use, why = decide_cache("auto", huge, placement)
    assert not use and "would not fit" in why
    augmented = ef.data.ImageFolder(mnist_dir + "/train", augment=ef.data.Augment(flip=True))
    use, why = decide_cache("auto", augmented, placement)
    assert not use and "random" in why
    with pytest.raises(ValueError, match="augmentation"):
        decide_cache(True, augmented, placement)
    with pytest.raises(ValueError, match="cache="):
        decide_cache("always", folder, placement)


def _host(chunk) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in chunk.items()}


def _live_bytes() -> int:
    return sum(a.nbytes for a in jax.live_arrays())


@pytest.mark.parametrize(("epoch_steps", "start"), [(None, 0), (7, 5)])
def test_the_recording_starts_after_the_first_step_grows_a_block_at_a_time_and_gives_the_streamed_chunks(
    mnist_dir, monkeypatch, epoch_steps, start
):
    folder = ef.data.ImageFolder(mnist_dir + "/train")  # 3,000 files: 15 chunks of 200 a pass
    placement = Placement.create()
    plan = Plan(folder.num_samples, 100, seed=3, steps_per_execution=2, epoch_steps=epoch_steps)
    to_record = chunks_to_cover(plan, start)
    chunks = to_record + 3  # the recording, then chunks gathered from the cache
    streaming = open_stream(folder, plan, placement, cached=False, start=start)
    want = [_host(next(streaming)) for _ in range(chunks)]
    streaming.close()
    one = sum(a.nbytes for k, a in want[0].items() if k != "mask")  # a recorded chunk
    dataset = one * folder.num_samples // 200
    monkeypatch.setattr(cache, "BLOCK_BYTES", 4 * one)  # 4 chunks a block: the last one part-full
    before = _live_bytes()
    cached = open_stream(folder, plan, placement, cached=True, start=start)
    for i in range(chunks):
        got = _host(next(cached))
        assert got.keys() == want[i].keys()
        for key in got:
            np.testing.assert_array_equal(got[key], want[i][key], err_msg=f"chunk {start + i}: {key}")
        if i < to_record - 1:  # still recording: chunks 0..i-1 (each recorded after its step)
            assert cached.recorded_bytes == -(-i // 4) * 4 * one
        if i == 0:  # the first step: nothing recorded, nothing of the dataset's size allocated
            assert cached.recorded_bytes == 0 and _live_bytes() - before < dataset / 4
    assert cached.recorded_bytes == 0  # the recording is released once placed
    cached.close()


def _chunks_to_cover_by_recording(plan: Plan, start: int) -> int:
    """The chunks from ``start`` until every sample has come once, counted chunk by chunk."""
    seen: set[int] = set()
    for count in itertools.count(1):
        index, mask = plan.chunk(start + count - 1)
        seen.update(index[mask].tolist())
        if len(seen) == plan.num_samples:
            return count
    raise AssertionError("unreachable")


def test_chunks_to_cover_counts_as_recording_chunk_by_chunk_would():
    for n, batch, spe, epoch_steps, shuffle in itertools.product(
        (1, 7, 10, 37), (1, 3, 4), (1, 2, 3), (None, 1, 2, 5), (True, False)
    ):
        plan = Plan(n, batch, shuffle=shuffle, seed=n, steps_per_execution=spe, epoch_steps=epoch_steps)
        for start in range(3 * plan.chunks_per_epoch + 2):
            assert chunks_to_cover(plan, start) == _chunks_to_cover_by_recording(plan, start), (plan, start)


class _CountingOrders(Orders):
    """A plan's orders, counting the passes drawn."""

    def __init__(self, plan: Plan):
        super().__init__(plan)
        self.drawn: list[int] = []

    def __call__(self, data_pass: int) -> np.ndarray:
        self.drawn.append(data_pass)
        return super().__call__(data_pass)


def test_chunks_to_cover_draws_at_most_two_orders_and_none_from_a_pass_start():
    plan = Plan(5000, 10, seed=1)  # 500 chunks a pass
    orders = _CountingOrders(plan)
    assert chunks_to_cover(plan, 1000, orders) == 500 and orders.drawn == []
    assert chunks_to_cover(plan, 1003, orders) > 497 and sorted(set(orders.drawn)) == [2, 3]
