"""The reference formats, written in their true on-disk formats, read through the one path."""

from __future__ import annotations

import os

import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.data import Loader
from tests.helpers import Crash, crash_at, crash_before, flat_params
from tests.helpers.internals import runs_per_chunk
from tests.helpers.models import SmallMLP
from tests.helpers.stream import loader_batches

N_TRAIN, N_VAL = 1000, 300
INDEXED = ["recordio", "tfrecord", "webdataset"]
KIND = {
    "lmdb": "Caffe2LMDB",
    "recordio": "RecordIO",
    "tfrecord": "TFRecord",
    "webdataset": "WebDataset",
    "npy": "NumpyFolder",
}


@pytest.fixture(scope="module")
def roots(format_roots) -> dict[str, str]:
    return format_roots


@pytest.fixture(scope="module")
def train_xy(mnist_arrays):
    x, y = mnist_arrays["train"]
    return x[:N_TRAIN], y[:N_TRAIN]


@pytest.mark.parametrize("fmt", list(KIND))
def test_a_directory_is_detected_by_its_contents(fmt, roots):
    source = ef.data.to_source(os.path.join(roots[fmt], "train"))
    assert type(source).__name__ == KIND[fmt]
    assert len(source) == N_TRAIN
    assert ef.data.split_layout(roots[fmt])[1].endswith("val")


@pytest.mark.parametrize("fmt", INDEXED)
def test_indexed_formats_deliver_exactly_the_arrays_batches(fmt, roots, train_xy):
    x, y = train_xy
    source = ef.data.to_source(os.path.join(roots[fmt], "train"))
    reference = ef.data.Arrays(x, y, scale=1 / 255)
    assert source.image_shape == (28, 28, 1) and source.scale == reference.scale
    for got, want in zip(
        loader_batches(source, 12, batch_size=100), loader_batches(reference, 12, batch_size=100), strict=True
    ):  # 1.2 epochs
        for key in ("x", "y", "mask"):
            np.testing.assert_array_equal(got[key], want[key])


def test_numpy_folders_deliver_their_arrays_in_folder_order(roots, train_xy):
    x, y = train_xy
    source = ef.data.NumpyFolder(os.path.join(roots["npy"], "train"))
    order = [int(os.path.basename(f).split(".")[0]) for f in source.files]
    reference = ef.data.Arrays(x[order], y[order], scale=1 / 255)
    assert source.class_names == [str(d) for d in range(10)]
    for got, want in zip(
        loader_batches(source, 5, batch_size=100), loader_batches(reference, 5, batch_size=100), strict=True
    ):
        for key in ("x", "y", "mask"):
            np.testing.assert_array_equal(got[key], want[key])


def test_lmdb_reads_every_record_once_per_epoch_in_its_own_order(roots, train_xy):
    x, y = train_xy
    source = ef.data.Caffe2LMDB(os.path.join(roots["lmdb"], "train"))
    assert isinstance(source, ef.data.ReaderSource) and source.num_samples == N_TRAIN
    ordered = loader_batches(source, 10, shuffle=False, batch_size=100)  # one pipeline: the LMDB's key order
    np.testing.assert_array_equal(np.concatenate([c["x"] for c in ordered]), x)
    np.testing.assert_array_equal(np.concatenate([c["y"] for c in ordered]), y)
    shuffled = loader_batches(source, 11, shuffle=True, batch_size=96)  # an epoch: 11 padded chunks
    got = _rows(*(np.concatenate([c[k][c["mask"]] for c in shuffled]) for k in ("x", "y")))
    assert len(got) == N_TRAIN and got != _rows(x, y)  # shuffled ...
    assert sorted(got) == sorted(_rows(x, y))  # ... each record once


def _rows(x, y):
    return [a.tobytes() + b.tobytes() for a, b in zip(x, y, strict=True)]


def test_lmdb_trains_and_evaluates_every_sample_once(roots, mnist_arrays):
    # Reference program 1's data: MNIST in a Caffe2 LMDB, fit(root) with train/ and val/.
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0)
    history = trainer.fit(roots["lmdb"], epochs=3, batch_size=100, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["val_accuracy"][-1] > 0.8
    xv, yv = mnist_arrays["val"][0][:N_VAL], mnist_arrays["val"][1][:N_VAL]
    val = os.path.join(roots["lmdb"], "val")
    reference = ef.data.Arrays(xv, yv, scale=1 / 255)
    for batch_size in (64, 300, 512):  # padded last batches of 44 and 212 rows, one exact
        got = trainer.evaluate(val, batch_size=batch_size)
        want = trainer.evaluate(reference, batch_size=batch_size)
        assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1e-6)
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        np.testing.assert_allclose(
            trainer.predict(val, batch_size=batch_size),
            trainer.predict(reference, batch_size=batch_size),
            rtol=1e-5,
            atol=1e-5,
        )


def test_every_format_trains_from_a_train_val_root(roots):
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0)
    for fmt in ("recordio", "npy", "tfrecord", "webdataset"):
        history = trainer.fit(roots[fmt], epochs=1, batch_size=100, verbose=0)
        assert set(history.history) == {"loss", "accuracy", "input_wait", "val_loss", "val_accuracy"}, fmt
        assert history.history["val_accuracy"][-1] > 0.7, fmt


def test_a_reader_driven_loader_resumes_where_the_stream_was(roots):
    source = ef.data.Caffe2LMDB(os.path.join(roots["lmdb"], "val"))
    plan = ef.data.Plan(source.num_samples, 64, shuffle=True, seed=1)
    stream = loader_batches(source, 8, batch_size=64, seed=1)  # 5 chunks an epoch: into the 2nd epoch
    loader = Loader(source, plan, ef.parallel.Placement.create(), start=6)
    resumed = {k: np.asarray(v) for k, v in next(loader).items()}
    loader.close()
    for key in ("x", "y", "mask"):
        np.testing.assert_array_equal(resumed[key], stream[6][key])


def test_a_reader_driven_loader_resumes_from_dalis_pipeline_checkpoints(roots):
    """The position holds DALI's own pipeline checkpoints (``enable_checkpointing``): a loader
    rebuilt from it continues the shuffled stream exactly, across an epoch's end, also when the
    next chunk was peeked, and reads nothing twice."""
    source = ef.data.Caffe2LMDB(os.path.join(roots["lmdb"], "val"))
    plan = ef.data.Plan(source.num_samples, 64, shuffle=True, seed=1)
    stream = loader_batches(source, 9, batch_size=64, seed=1)  # 5 chunks an epoch: into the 2nd epoch
    for taken, peek in ((3, False), (4, True)):
        first = Loader(source, plan, ef.parallel.Placement.create())
        for _ in range(taken):
            next(first)
        if peek:
            first.peek()
        position = first.position()
        first.close()
        assert position["chunk"] == taken and len(position["dali"]) == 1
        resumed = Loader(source, plan, ef.parallel.Placement.create(), position=position)
        try:
            for i in range(taken, 9):
                got = next(resumed)
                for key in ("x", "y", "mask"):
                    np.testing.assert_array_equal(np.asarray(got[key]), stream[i][key])
        finally:
            resumed.close()


def test_an_lmdb_read_in_runs_delivers_every_record_once_per_epoch(roots, train_xy):
    x, y = train_xy
    source = ef.data.Caffe2LMDB(os.path.join(roots["lmdb"], "train"))
    for shuffle in (False, True):  # 300 rows a chunk: 2 runs of 150; 7 runs an epoch: 4 chunks
        plan = ef.data.Plan(source.num_samples, 100, shuffle=shuffle, seed=0, steps_per_execution=3)
        loader = Loader(source, plan, ef.parallel.Placement.create())
        assert runs_per_chunk(loader) == 2
        assert loader.plan.chunks_per_epoch == 4
        try:
            for _ in range(2):
                chunks = [
                    {k: np.asarray(v) for k, v in next(loader).items()}
                    for _ in range(loader.plan.chunks_per_epoch)
                ]
                got = [np.concatenate([c[k][c["mask"]] for c in chunks]) for k in ("x", "y")]
                if not shuffle:
                    np.testing.assert_array_equal(got[0], x)  # the LMDB's key order
                assert sorted(_rows(*got)) == sorted(_rows(x, y))
        finally:
            loader.close()


@pytest.mark.parametrize(
    ("steps_per_epoch", "epochs", "save_freq", "crash", "point"),
    [(None, 2, 2, (1, 4), (1, 4)), (4, 3, 3, (2, 2), (2, 1))],
    ids=["passes", "steps_per_epoch"],  # 4 steps an epoch: the backup before the pass's last step
)
def test_an_lmdb_fit_resumes_mid_epoch_from_a_backup_bit_for_bit(
    roots, tmp_path, steps_per_epoch, epochs, save_freq, crash, point
):
    """BackupAndRestore saves the reader pipelines' DALI checkpoints in the loader position;
    a streaming fit killed mid-epoch and restarted ends with the parameters of a fit never
    killed (with steps_per_epoch too, its resumed epoch crossing from one reader pass into the
    next). Restarted with cache="auto", which would cache the LMDB, it streams as the backup's
    fit did (the device cache orders the samples otherwise)."""
    from easyfit.callbacks import BackupAndRestore

    train = os.path.join(roots["lmdb"], "train")

    def fit(callbacks=(), cache="auto", trainer=None):
        trainer = trainer or ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=3)
        trainer.fit(
            train,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            batch_size=100,
            verbose=0,
            cache=cache,
            callbacks=list(callbacks),
        )
        return trainer

    reference = fit(cache=False)
    crashing = ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=3)
    with pytest.raises(Crash):
        fit(
            [
                BackupAndRestore(tmp_path / "b", save_freq=save_freq),
                (crash_at if steps_per_epoch else crash_before)(crashing, *crash),
            ],
            cache=False,
            trainer=crashing,
        )
    saved = BackupAndRestore(tmp_path / "b").restore_point()
    assert (saved.epoch, saved.batch) == point and saved.position["dali"]
    with pytest.raises(ValueError, match="written without the device cache.*resume with cache=False"):
        fit([BackupAndRestore(tmp_path / "b")], cache=True)
    resumed = fit([BackupAndRestore(tmp_path / "b", save_freq=save_freq)])  # cache="auto"
    np.testing.assert_array_equal(flat_params(resumed.params), flat_params(reference.params))


def test_an_lmdb_with_steps_per_epoch_reads_on_through_its_passes(roots):
    """Epochs of steps_per_epoch steps read the reader's stream on (a pass: 10 steps), in the
    order of a plain stream."""
    source = ef.data.Caffe2LMDB(os.path.join(roots["lmdb"], "train"))

    def labels(k, steps_per_epoch, chunks):
        plan = ef.data.Plan(
            source.num_samples, 100, seed=0, steps_per_execution=k, epoch_steps=steps_per_epoch
        )
        loader = Loader(source, plan, ef.parallel.Placement.create())
        try:
            return np.concatenate(
                [np.asarray(c["y"])[np.asarray(c["mask"])] for c in (next(loader) for _ in range(chunks))]
            )
        finally:
            loader.close()

    plain = labels(1, None, 30)
    np.testing.assert_array_equal(labels(1, 4, 12), plain[:1200])
    np.testing.assert_array_equal(labels(3, 13, 10), plain[:2600])  # 2 epochs of 13 steps (5 chunks)
