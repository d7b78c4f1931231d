"""The device cache of a source read by DALI's own reader (a Caffe2 LMDB): read once in the
LMDB's key order, then every epoch a permutation drawn from (seed, epoch), resumed exactly. On 4
devices: tests/data/test_pipelines.py (tests/programs/formats_devices.py)."""

from __future__ import annotations

import os

import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.callbacks import BackupAndRestore
from easyfit.data.loader import decide_cache, open_stream
from easyfit.parallel import Placement
from tests.helpers import Crash, crash_at, flat_params
from tests.helpers.models import SmallMLP

N = 1000  # format_roots' training records


@pytest.fixture(scope="module")
def lmdb(format_roots) -> str:
    return os.path.join(format_roots["lmdb"], "train")


@pytest.fixture(scope="module")
def train_xy(mnist_arrays):
    x, y = mnist_arrays["train"]
    return x[:N], y[:N]


def _epochs(source, seed, epochs=3, batch_size=96, steps=2, **options):
    """Each epoch's chunks of a cached LMDB (x, y, mask on the host), and the plan."""
    plan = ef.data.Plan(N, batch_size, shuffle=True, seed=seed, steps_per_execution=steps)
    loader = open_stream(source, plan, Placement.create(), cached=True, **options)
    try:
        return plan, [
            [{k: np.asarray(v) for k, v in next(loader).items()} for _ in range(plan.chunks_per_epoch)]
            for _ in range(epochs)
        ]
    finally:
        loader.close()


def _rows(x, y) -> list[bytes]:
    return [a.tobytes() + b.tobytes() for a, b in zip(x, y, strict=True)]


def test_every_epoch_is_a_permutation_of_the_key_order_drawn_from_seed_and_epoch(lmdb, train_xy):
    x, y = train_xy
    source = ef.data.Caffe2LMDB(lmdb)
    plan, epochs = _epochs(source, seed=0)  # 192 rows a chunk: 6 chunks, the last one padded
    orders = []
    for epoch, chunks in enumerate(epochs):
        seen = []
        for c, chunk in enumerate(chunks):
            index, mask = plan.chunk(epoch * plan.chunks_per_epoch + c)
            np.testing.assert_array_equal(chunk["mask"], mask)
            np.testing.assert_array_equal(chunk["x"], x[index])  # the samples the plan says
            np.testing.assert_array_equal(chunk["y"], y[index])
            seen += _rows(chunk["x"][mask], chunk["y"][mask])
        assert sorted(seen) == sorted(_rows(x, y))  # each record exactly once
        orders.append(seen)
    assert orders[0] != orders[1] != orders[2]  # a new permutation every epoch
    _, again = _epochs(source, seed=0, epochs=1, batch_size=50, steps=1)  # another run, batching
    assert [r for c in again[0] for r in _rows(c["x"][c["mask"]], c["y"][c["mask"]])] == orders[0]
    _, other = _epochs(source, seed=1, epochs=1)
    assert [r for c in other[0] for r in _rows(c["x"][c["mask"]], c["y"][c["mask"]])] != orders[0]


def test_an_lmdb_read_once_into_blocks_the_last_one_part_full_is_cached_as_in_one(lmdb, monkeypatch):
    from easyfit.data import cache

    source = ef.data.Caffe2LMDB(lmdb)
    _, whole = _epochs(source, seed=0, epochs=2)  # 6 chunks of 192 rows, recorded in one block
    first = whole[0][0]
    one = first["x"].nbytes + first["y"].nbytes + 4 * len(first["mask"])  # x, y and the slots
    monkeypatch.setattr(cache, "BLOCK_BYTES", int(4.5 * one))  # 4 or 5 chunks a block: 2 blocks
    _, blocks = _epochs(source, seed=0, epochs=2)
    for epoch, (want, got) in enumerate(zip(whole, blocks, strict=True)):
        for c, (a, b) in enumerate(zip(want, got, strict=True)):
            for key in a:
                np.testing.assert_array_equal(b[key], a[key], err_msg=f"epoch {epoch}, chunk {c}: {key}")


def test_auto_caches_an_lmdb_that_fits_and_no_random_augmentation(lmdb):
    placement = Placement.create()
    use, why = decide_cache("auto", ef.data.Caffe2LMDB(lmdb), placement)
    assert use and why.startswith(
        "caching the decoded dataset on the device after one read by its DALI reader"
    )
    augmented = ef.data.Caffe2LMDB(lmdb, augment=ef.data.Augment(flip=True))
    use, why = decide_cache("auto", augmented, placement)
    assert not use and "random" in why
    with pytest.raises(ValueError, match="augmentation"):
        decide_cache(True, augmented, placement)


def test_cache_true_on_an_lmdb_trains_and_evaluates_every_sample_once(format_roots, mnist_arrays, capsys):
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0)
    history = trainer.fit(format_roots["lmdb"], epochs=2, batch_size=100, verbose=0, cache=True)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["val_accuracy"][-1] > 0.7
    trainer.fit(format_roots["lmdb"], epochs=1, batch_size=100, verbose=2)  # cache="auto"
    assert "easyfit: caching the decoded dataset on the device after one read by its DALI reader" in (
        capsys.readouterr().out
    )
    val = os.path.join(format_roots["lmdb"], "val")  # cached too: every record once
    got = trainer.evaluate(val, batch_size=64)
    want = trainer.evaluate(
        ef.data.Arrays(*(a[:300] for a in mnist_arrays["val"]), scale=1 / 255), batch_size=64
    )
    assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1e-6)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    # predict's rows in the key order: tests/data/test_sources.py (fit and evaluate cache "auto")


def _fit(lmdb, callbacks=(), cache=True, trainer=None) -> ef.Trainer:
    trainer = trainer or ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=3)
    trainer.fit(lmdb, epochs=2, batch_size=100, verbose=0, cache=cache, callbacks=list(callbacks))
    return trainer


def test_a_cached_lmdb_fit_resumes_inside_its_first_epoch_bit_for_bit(lmdb, tmp_path):
    """The backup's position is a chunk of the permutations: the resumed fit reads the LMDB once
    again, and goes on with the samples of the fit never stopped."""
    reference = _fit(lmdb)
    crashing = ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=3)
    with pytest.raises(Crash):
        _fit(
            lmdb, [BackupAndRestore(tmp_path / "b", save_freq=3), crash_at(crashing, 0, 6)], trainer=crashing
        )
    point = BackupAndRestore(tmp_path / "b").restore_point()
    assert (point.epoch, point.batch) == (0, 6) and point.position == {"chunk": 6, "cached": True}
    with pytest.raises(ValueError, match="written with the device cache.*resume with cache=True"):
        _fit(lmdb, [BackupAndRestore(tmp_path / "b")], cache=False)  # another order: refused
    resumed = _fit(lmdb, [BackupAndRestore(tmp_path / "b", save_freq=3)], cache="auto")
    assert int(resumed.state.step) == int(reference.state.step) == 20
    assert np.array_equal(flat_params(resumed.params), flat_params(reference.params))
    assert np.array_equal(flat_params(resumed.state.opt_state), flat_params(reference.state.opt_state))


def test_a_cached_lmdb_with_steps_per_epoch_trains_the_batches_of_its_passes(lmdb):
    """4 epochs of 5 steps train the 20 steps of 2 passes (10 steps each), bit for bit: the one
    read covers a whole pass, and only where epochs end moves."""
    whole = _fit(lmdb)
    cut = ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=3)
    cut.fit(lmdb, epochs=4, steps_per_epoch=5, batch_size=100, verbose=0, cache=True)
    assert int(cut.state.step) == int(whole.state.step) == 20
    assert np.array_equal(flat_params(cut.params), flat_params(whole.params))
