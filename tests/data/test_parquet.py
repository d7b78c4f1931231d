"""Parquet shards (Hugging Face's layout), written with pyarrow from the MNIST sample, read
through the one path: detected, batched as arrays and folders are, resumed exactly, bad shards
named by file, row group and row."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import sys
import warnings

import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.data.parquet_read import fed_images
from easyfit.data.sources.parquet import hf_splits
from tests.helpers import Crash, crash_before, flat_params
from tests.helpers.formats import encode, write_hf_splits, write_parquet
from tests.helpers.models import SmallMLP
from tests.helpers.stream import loader_batches

pq = pytest.importorskip("pyarrow.parquet")

N_TRAIN, N_VAL = 200, 100


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return ef.datasets.sample_folder(tmp_path_factory.mktemp("mnist") / "mnist", limit=(N_TRAIN, N_VAL))


@pytest.fixture(scope="module")
def hf_root(tmp_path_factory, folder) -> str:
    """The image folder's files, in its order, as Hugging Face's shards: string labels (the
    class folders' names), the images as Hugging Face's Image struct, 32 rows a row group."""
    splits = {}
    for name, split in (("train", "train"), ("validation", "val")):
        source = ef.data.ImageFolder(os.path.join(folder, split))
        images = [open(f, "rb").read() for f in source.files]
        splits[name] = (images, [source.class_names[k] for k in source.labels])
    return write_hf_splits(tmp_path_factory.mktemp("hf") / "hf", splits)


@pytest.fixture(scope="module")
def arrays(mnist_arrays):
    x, y = mnist_arrays["train"]
    return x[:N_TRAIN], y[:N_TRAIN]


def test_a_hugging_face_root_is_detected_and_split_into_train_and_validation(hf_root):
    train, val = ef.data.split_layout(hf_root)
    assert train == os.path.join(hf_root, "data", "train-*.parquet")
    assert val == os.path.join(hf_root, "data", "validation-*.parquet")
    assert ef.data.detect(hf_root) is ef.data.Parquet
    assert ef.data.detect(train) is ef.data.Parquet
    assert ef.data.detect(os.path.join(hf_root, "data", "train-00000-of-00002.parquet")) is ef.data.Parquet
    source = ef.data.to_source(train)
    assert len(source) == N_TRAIN and len(source.files) == 2
    assert source.class_names == [str(d) for d in range(10)]  # the sorted string labels
    with pytest.raises(ef.errors.DataError, match=r"holds the splits train, validation .*train-\*\.parquet"):
        ef.data.Parquet(hf_root)  # which split: the caller says


def test_shards_not_named_by_split_are_one_dataset_and_split_names_still_split(tmp_path):
    """``shard0.parquet``... are shards of one dataset (not three splits, a third of the data
    each); ``train.parquet`` and Hugging Face's ``<split>-0000k-of-0000n`` name splits."""
    images, _ = _shard(tmp_path, n=12)
    plain = tmp_path / "plain"
    plain.mkdir()
    for k in range(3):
        write_parquet(plain / f"shard{k}.parquet", images[4 * k : 4 * k + 4], [k] * 4, row_group_size=4)
    assert ef.data.split_layout(plain) is None and ef.data.detect(plain) is ef.data.Parquet
    source = ef.data.to_source(str(plain))
    assert len(source) == 12 and source.known_labels().tolist() == [0] * 4 + [1] * 4 + [2] * 4
    named = tmp_path / "named"
    named.mkdir()
    for split in ("train", "test"):
        write_parquet(named / f"{split}.parquet", images, [0, 1] * 6, row_group_size=4)
    assert ef.data.split_layout(named) == (str(named / "train.parquet"), str(named / "test.parquet"))
    hf = tmp_path / "hf"
    hf.mkdir()
    for k in range(2):
        write_parquet(hf / f"shard-0000{k}-of-00002.parquet", images, [0, 1] * 6, row_group_size=4)
    assert hf_splits(hf) == {"shard": str(hf / "shard-*.parquet")}
    assert len(ef.data.to_source(str(hf))) == 24


def test_a_hugging_face_save_to_disk_folder_is_named_for_what_it_is(tmp_path):
    """``datasets``' ``save_to_disk`` writes Arrow IPC streams and two json files (a
    ``DatasetDict``: a folder per split and ``dataset_dict.json``), not Parquet."""
    import json

    import pyarrow as pa

    images, _ = _shard(tmp_path, n=4)
    table = pa.table({"image": pa.array(images, pa.binary()), "label": pa.array([0, 1, 0, 1])})
    root = tmp_path / "saved"
    train = root / "train"
    train.mkdir(parents=True)
    with pa.ipc.new_stream(str(train / "data-00000-of-00001.arrow"), table.schema) as writer:
        writer.write_table(table)
    (train / "dataset_info.json").write_text(json.dumps({"features": {}}))
    (train / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    says = r": these are Arrow files \(Hugging Face datasets' save_to_disk\).*to_parquet.*pass arrays"
    for path in (train, root, train / "data-00000-of-00001.arrow"):
        with pytest.raises(ef.errors.DataError, match=rf"^{path}{says}"):
            ef.data.detect(path)
    trainer = ef.Trainer(SmallMLP(), seed=0)
    with pytest.raises(ef.errors.DataError, match=rf"^{train}{says}"):  # root/train: its split
        trainer.fit(str(root), epochs=1, verbose=0)


def test_shuffled_batches_are_exactly_the_arrays_batches(tmp_path, arrays):
    """MNIST's arrays written as PNG bytes in a plain binary column with ClassLabel names: the
    same Plan gives the same batches, pixels and labels, across row groups and shards."""
    x, y = arrays
    root = write_hf_splits(
        tmp_path / "hf",
        {"train": ([encode(img) for img in x], y.astype(np.int64))},
        shards=3,
        struct=False,
        class_names=[f"digit {d}" for d in range(10)],
    )
    source = ef.data.Parquet(os.path.join(root, "data"), cache_bytes=1 << 20)
    assert source.class_names == [f"digit {d}" for d in range(10)]  # from the ClassLabel metadata
    assert source.image_shape == (28, 28, 1) and source.num_samples == N_TRAIN
    reference = loader_batches(ef.data.Arrays(x, y, scale=1 / 255), 5, batch_size=64)  # 1.25 passes
    # cached whole: DALI slices the row groups' own buffers; then a cache of a quarter of the
    # images (two of the nine row groups), read ahead and dropped again and again: each
    # batch's images copied out
    small = ef.data.Parquet(os.path.join(root, "data"), cache_bytes=source.image_bytes // 4)
    with pytest.warns(UserWarning, match=r"row groups are read again and again"):
        got_small = loader_batches(small, 5, batch_size=64)
    for got in (loader_batches(source, 5, batch_size=64), got_small):
        for batch, want in zip(got, reference, strict=True):
            for key in ("x", "y", "mask"):
                np.testing.assert_array_equal(batch[key], want[key])
    assert small._groups._cached_bytes <= small.cache_bytes  # never more held than it allows


def _fit(data, callbacks=(), trainer=None):
    """Two epochs of 5 steps, streamed (one step per dispatch: a backup can fall mid-epoch)."""
    trainer = trainer or ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=3, steps_per_execution=1)
    trainer.fit(data, epochs=2, batch_size=40, cache=False, verbose=0, callbacks=list(callbacks))
    return trainer


@pytest.fixture(scope="module")
def from_shards(hf_root):
    return _fit(hf_root)


def test_fit_on_the_shards_gives_the_folders_parameters_bit_for_bit(from_shards, hf_root, folder):
    from_folder = _fit(folder)
    np.testing.assert_array_equal(flat_params(from_shards.params), flat_params(from_folder.params))
    assert from_shards.history.history["val_loss"] == from_folder.history.history["val_loss"]
    val = os.path.join(hf_root, "data", "validation-*.parquet")
    np.testing.assert_array_equal(
        from_shards.predict(val, batch_size=64),
        from_folder.predict(os.path.join(folder, "val"), batch_size=64),
    )


def test_a_fit_resumes_mid_epoch_from_a_backup_bit_for_bit(from_shards, hf_root, tmp_path):
    from easyfit.callbacks import BackupAndRestore

    crashing = ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=3, steps_per_execution=1)
    with pytest.raises(Crash):
        _fit(hf_root, [BackupAndRestore(tmp_path / "b", save_freq=2), crash_before(crashing, 1, 3)], crashing)
    saved = BackupAndRestore(tmp_path / "b").restore_point()
    assert (saved.epoch, saved.batch) == (1, 3)  # mid-epoch: 3 of the 5 steps of epoch 1 done
    resumed = _fit(hf_root, [BackupAndRestore(tmp_path / "b", save_freq=2)])
    np.testing.assert_array_equal(flat_params(resumed.params), flat_params(from_shards.params))


def _shard(tmp_path, n=40, **options):
    rng = np.random.default_rng(0)
    images = [encode(rng.integers(0, 255, (8, 8), np.uint8)) for _ in range(n)]
    return images, write_parquet(
        tmp_path / "s.parquet", images, np.arange(n) % 3, row_group_size=10, **options
    )


def test_a_truncated_shard_is_named(tmp_path):
    _, path = _shard(tmp_path)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(
        ef.errors.DataError, match=rf"^{path}: not a readable Parquet file .*truncated or damaged"
    ):
        ef.data.Parquet(path)


def test_a_damaged_row_group_names_the_file_the_row_group_and_its_rows(tmp_path):
    _, path = _shard(tmp_path)
    chunk = pq.ParquetFile(path).metadata.row_group(2).column(0)  # the image column of rows 20-29
    with open(path, "r+b") as f:  # its data page's header smashed
        f.seek(chunk.data_page_offset)
        f.write(b"\xff" * 16)
    source = ef.data.Parquet(path, image_size=(8, 8), color_mode="grayscale")  # labels read, no image
    source.feed(np.arange(10))  # row group 0: read as ever
    with pytest.raises(ef.errors.DataError, match=rf"^{path}: row group 2 \(rows 20-29\) cannot be read"):
        source.feed(np.array([3, 25]))


def test_a_missing_column_names_the_file_and_the_columns_it_has(tmp_path):
    _, path = _shard(tmp_path, label="class")
    with pytest.raises(
        ef.errors.DataError, match=rf"^{path}: no column 'label' \(its columns: image, class\); pass .*label="
    ):
        ef.data.Parquet(path)
    source = ef.data.Parquet(path, label="class")
    assert source.num_samples == 40
    again = ef.data.to_source(path, recipe=source.recipe())  # a trained model's recipe: its columns
    assert (again.image_column, again.label_column) == ("image", "class")


def test_a_null_image_names_the_file_the_row_group_and_the_row(tmp_path):
    images, _ = _shard(tmp_path)
    images[23] = None
    path = write_parquet(tmp_path / "n.parquet", images, np.arange(40) % 3, row_group_size=10)
    source = ef.data.Parquet(path, image_size=(8, 8), color_mode="grayscale")  # no sample read
    with pytest.raises(
        ef.errors.DataError, match=rf"^{path}: row group 2, row 23: no image \(null in column"
    ):
        loader_batches(source, 1, batch_size=40)


def test_an_image_that_is_not_one_names_the_file_the_row_group_and_the_row(tmp_path):
    images, _ = _shard(tmp_path)
    images[37] = b"not an image at all"
    path = write_parquet(tmp_path / "b.parquet", images, np.arange(40) % 3, row_group_size=10, struct=False)
    source = ef.data.Parquet(path, image_size=(8, 8), color_mode="grayscale")
    with pytest.raises(ef.errors.DataError, match=rf"^{path}: row group 3, row 37: not an image"):
        source.feed(np.arange(30, 40))


def test_a_row_group_read_again_from_a_rewritten_shard_is_refused_by_name(tmp_path):
    images, path = _shard(tmp_path)
    source = ef.data.Parquet(path, cache_bytes=1, image_size=(8, 8), color_mode="grayscale")
    source.feed(np.arange(10))  # row group 0 read and checked...
    source.feed(np.arange(10, 20))  # ...and dropped for row group 1
    images[3] = images[3][:-20]  # cut short: no end-of-image chunk
    write_parquet(path, images, np.arange(40) % 3, row_group_size=10)
    with pytest.raises(ef.errors.DataError, match=rf"^{path}: changed since the fit started"):
        source.feed(np.arange(10))


def test_labels_a_null_a_foreign_class_and_a_labelless_split_are_named(tmp_path):
    images, _ = _shard(tmp_path, n=20)
    nulls = write_parquet(tmp_path / "a.parquet", images, [0] * 13 + [None] + [1] * 6, row_group_size=10)
    with pytest.raises(ef.errors.DataError, match=rf"^{nulls}: row group 1, row 13: no label"):
        ef.data.Parquet(nulls)
    names = write_parquet(
        tmp_path / "b.parquet", images, ["cat", "dog"] * 9 + ["emu", "cat"], row_group_size=10
    )
    with pytest.raises(ef.errors.DataError, match=rf"^{names}: row group 1, row 18: class 'emu' is not one"):
        ef.data.Parquet(names, class_names=["cat", "dog"])  # the training data's classes
    test = write_parquet(
        tmp_path / "c.parquet", images, [-1] * 20, class_names=["cat", "dog"], row_group_size=10
    )
    with pytest.raises(
        ef.errors.DataError, match=rf"^{test}: row group 0, row 0: label -1 is not one of the 2"
    ):
        ef.data.Parquet(test)


def test_a_validation_split_with_a_class_training_lacks_is_refused_by_fit(tmp_path):
    images, _ = _shard(tmp_path, n=20)
    splits = {"train": (images, ["cat", "dog"] * 10), "validation": (images, ["cat"] * 19 + ["emu"])}
    root = write_hf_splits(tmp_path / "hf", splits, shards=1)
    val = os.path.join(root, "data", "validation-00000-of-00001.parquet")
    trainer = ef.Trainer(SmallMLP(), seed=0)
    with pytest.raises(ef.errors.DataError, match=rf"^{val}: row group 0, row 19: class 'emu' is not one"):
        trainer.fit(root, epochs=1, verbose=0)


def test_threads_feeding_at_once_get_the_rows_they_ask_for(tmp_path):
    """DALI's feeding threads share the source and its readers: each row group is read once at
    a time, the cache under its lock; every thread gets its rows' bytes. The shard is stored
    uncompressed: read through a memory map."""
    images, path = _shard(tmp_path, compression="none")
    source = ef.data.Parquet(path, cache_bytes=2000, image_size=(8, 8), color_mode="grayscale")
    assert source._groups._memory_map == [True]
    source.prepare(np.arange(40))  # read ahead, beyond what the cache keeps
    orders = [np.random.default_rng(k).permutation(40) for k in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        fed = list(pool.map(source.feed, orders))
    for order, got in zip(orders, fed, strict=True):
        assert fed_images(got) == [images[i] for i in order]


def test_reading_row_groups_again_and_again_is_warned_once(tmp_path):
    _, path = _shard(tmp_path)
    small = ef.data.Parquet(path, cache_bytes=1)  # one row group held at a time
    order = np.random.default_rng(0).permutation(40)
    with pytest.warns(UserWarning, match=r"row groups are read again and again.*cache_bytes"):
        for batch in order.reshape(4, 10):
            small.feed(batch)
    roomy = ef.data.Parquet(path)
    in_order = ef.data.Parquet(path, cache_bytes=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for batch in np.tile(order, 3).reshape(12, 10):  # every row group read once, kept
            roomy.feed(batch)
        for batch in np.tile(np.arange(40), 3).reshape(12, 10):  # each row group read once a pass
            in_order.feed(batch)


def test_without_pyarrow_the_error_names_the_extra(tmp_path, monkeypatch):
    _, path = _shard(tmp_path, n=4)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as when it is not installed: import fails
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(
        ImportError, match=r"^reading Parquet needs pyarrow: pip install 'easyfit-flax\[parquet\]'"
    ):
        ef.data.Parquet(path)


def test_easyfit_info_shows_the_pyarrow_installed():
    import pyarrow

    from easyfit import _info

    env = _info.collect()
    assert re.search(rf"^pyarrow +{re.escape(pyarrow.__version__)}$", _info.report(env), re.M)
    gone = _info.report(dataclasses.replace(env, versions={**env.versions, "pyarrow": None}))
    assert re.search(r"^pyarrow +not installed$", gone, re.M)
