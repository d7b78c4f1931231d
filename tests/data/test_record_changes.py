"""A record file rewritten after its source read it (labels, byte ranges, row groups, checked
records) is refused by name when it is read again, never read with what was read of its old
bytes; a resumed fit's data fingerprint tells a rewrite that moved records or labels (issue 47)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import easyfit as ef
from easyfit.persistence.fingerprint import data_fingerprint, fingerprint_changes
from tests.helpers.formats import (
    encode,
    write_lmdb,
    write_parquet,
    write_recordio,
    write_tfrecord,
    write_webdataset,
)

N = 24
CHANGED = "changed since the fit started"


@pytest.fixture(scope="module")
def sample(mnist_arrays):
    x, y = mnist_arrays["train"]
    return [encode(a) for a in x[:N]], [int(v) % 3 for v in y[:N]]


def _reordered(sample):
    """The same records, reversed: what a re-export that orders rows otherwise writes."""
    images, labels = sample
    return images[::-1], labels[::-1]


def _stream_until_refused(source, rewrite) -> None:
    """A loader of ``source`` (real DALI pipelines, shuffled passes) reads a pass, then
    ``rewrite()`` rewrites its file, then it reads on until it raises (past the chunks it
    read ahead)."""
    loader = ef.data.Loader(source, ef.data.Plan(N, 4, shuffle=True, seed=0), ef.parallel.Placement.create())
    try:
        for _ in range(N // 4):
            next(loader)
        rewrite()
        for _ in range(3 * N):
            next(loader)
    finally:
        loader.close()


@pytest.mark.filterwarnings("ignore:.*row groups are read again and again")
def test_a_parquet_shard_rewritten_between_epochs_is_refused_naming_it(tmp_path, sample):
    path = write_parquet(tmp_path / "s.parquet", *sample, row_group_size=8)
    source = ef.data.Parquet(path, cache_bytes=1)  # one row group held: the others read again
    with pytest.raises(ef.errors.DataError, match=rf"^{path}: {CHANGED} \(its labels and row groups"):
        _stream_until_refused(source, lambda: write_parquet(path, *_reordered(sample), row_group_size=8))


@pytest.mark.parametrize("fmt", ["webdataset", "tfrecord", "recordio"])
def test_a_record_file_rewritten_since_it_was_indexed_is_refused_by_name(tmp_path, sample, fmt):
    write, make = {
        "webdataset": (write_webdataset, ef.data.WebDataset),
        "tfrecord": (write_tfrecord, ef.data.TFRecord),
        "recordio": (write_recordio, ef.data.RecordIO),
    }[fmt]
    images, labels = sample
    path = write(
        str(tmp_path / f"s.{ {'webdataset': 'tar', 'recordio': 'rec'}.get(fmt, fmt) }"), images, labels
    )
    source = make(path)
    fed, _ = source.feed(np.arange(N))
    assert [bytes(a) for a in fed] == images
    os.chmod(path, 0o600)  # its bytes unchanged: still read
    source.feed(np.arange(4))
    write(path, *_reordered(sample))
    with pytest.raises(ef.errors.DataError, match=rf"^{path}: {CHANGED}"):
        source.feed(np.arange(4))
    with pytest.raises(ef.errors.DataError, match=rf"^{path}: {CHANGED}"):
        source.sample_problem(0)  # a failed batch's diagnosis reads it neither


def test_an_lmdb_replaced_under_its_reader_is_refused_before_the_next_chunk(tmp_path, sample):
    path = write_lmdb(tmp_path / "db", *sample)

    def replace() -> None:  # a new database renamed over it, as a copy does
        other = write_lmdb(tmp_path / "other", *_reordered(sample))
        os.replace(os.path.join(other, "data.mdb"), os.path.join(path, "data.mdb"))

    with pytest.raises(ef.errors.DataError, match=rf"^{path}/data.mdb: {CHANGED} \(its records"):
        _stream_until_refused(ef.data.Caffe2LMDB(path), replace)


def test_a_resumed_fit_tells_a_rewrite_that_moved_records_or_labels(tmp_path, sample):
    """What a backup records and a resuming fit compares (``ResumePoint.check_data``)."""
    parquet = write_parquet(tmp_path / "s.parquet", *sample, row_group_size=8)
    tar = write_webdataset(tmp_path / "s.tar", *sample)
    saved = [data_fingerprint(ef.data.Parquet(parquet)), data_fingerprint(ef.data.WebDataset(tar))]
    size = os.path.getsize(tar)
    write_parquet(parquet, *_reordered(sample), row_group_size=8)
    write_webdataset(tar, *_reordered(sample))
    assert os.path.getsize(tar) == size  # its name and size say nothing
    now = [data_fingerprint(ef.data.Parquet(parquet)), data_fingerprint(ef.data.WebDataset(tar))]
    records = "the records read from the files (their byte ranges, row groups or labels) changed"
    assert fingerprint_changes(saved[1], now[1]) == records
    assert records in str(fingerprint_changes(saved[0], now[0]))
    older = {k: v for k, v in saved[1].items() if k != "records"}  # a backup from before the key
    assert fingerprint_changes(older, now[1]) is None
    os.makedirs(tmp_path / "elsewhere")
    copy = shutil.copy(tar, tmp_path / "elsewhere")  # the same data copied (new times): resumes
    assert fingerprint_changes(now[1], data_fingerprint(ef.data.WebDataset(copy))) is None
