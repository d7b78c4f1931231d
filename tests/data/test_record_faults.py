"""Records that would train wrong or fail obscurely are named (issue 27): labels beyond int32,
float labels where class indices are expected, labels outside the model's outputs in records
fed after the first batch, TFRecord index rows outside their file."""

from __future__ import annotations

import numpy as np
import pytest

import easyfit as ef
from easyfit.data.images import sample_positions
from easyfit.data.validation.encoded import HEAD
from tests.helpers.formats import all_labels, encode, write_recordio, write_tfrecord, write_webdataset
from tests.helpers.models import SmallMLP

N = 80  # more than the 64 records a TFRecord's label dtype is inferred from
LATE = next(i for i in range(N) if i not in set(sample_positions(N).tolist()))  # never sampled


@pytest.fixture(scope="module")
def sample(mnist_arrays):
    x, y = mnist_arrays["train"]
    return [encode(a) for a in x[:N]], [int(v) for v in y[:N]]


def test_int64_labels_beyond_int32_are_refused_not_wrapped():
    y = np.array([0, 1, 2**32 + 3], np.int64)  # astype(int32) would make it class 3
    with pytest.raises(ef.errors.DataError, match=r"^y \(at x\[2\]\): label 4294967299 does not fit"):
        ef.data.Arrays(np.zeros((3, 2), np.float32), y)
    with pytest.raises(ef.errors.DataError, match=r"^y\['b'\] \(at x\[0\]\): label -4294967295"):
        ef.data.Arrays(np.zeros((3, 2)), {"a": np.arange(3), "b": np.array([1 - 2**32, 0, 1])})


def test_a_tfrecord_float_label_outside_the_sample_is_refused_not_truncated(tmp_path, sample):
    images, labels = sample
    labels = list(labels)
    labels[LATE] = 3.7
    path = write_tfrecord(tmp_path / "d.tfrecord", images, labels)
    source = ef.data.TFRecord(path)
    assert source.label_dtype.kind == "i"  # inferred from the sampled records
    with pytest.raises(
        ef.errors.DataError,
        match=rf"^{path}: record {LATE} \(byte offset \d+\): label 3.7\d* is not a whole number",
    ):
        all_labels(source)


def test_a_tfrecord_label_beyond_int32_names_its_record(tmp_path, sample):
    images, labels = sample
    labels = list(labels)
    labels[LATE] = 2**40
    path = write_tfrecord(tmp_path / "d.tfrecord", images, labels)
    with pytest.raises(ef.errors.DataError, match=rf"^{path}: record {LATE} .*: label {2**40} does not fit"):
        all_labels(ef.data.TFRecord(path))


def test_webdataset_and_recordio_labels_beyond_int32_name_their_sample(tmp_path, sample):
    images, labels = sample[0][:4], [0, 1, 2**40, 3]
    tar = write_webdataset(tmp_path / "s.tar", images, labels)
    with pytest.raises(ef.errors.DataError, match=rf"^{tar}: 000002: label {2**40} does not fit"):
        ef.data.WebDataset(tar)
    rec = write_recordio(tmp_path / "d.rec", images, [0, 1, 2.0**40, 3])
    with pytest.raises(ef.errors.DataError, match=rf"^{rec}: record 2 .*: label {2**40} does not fit"):
        ef.data.RecordIO(rec)


def test_a_tfrecord_label_outside_the_outputs_after_the_first_batch_names_its_record(tmp_path, sample):
    images, labels = sample
    labels = list(labels)
    labels[-1] = 12  # a 10-output model; the last batch
    path = write_tfrecord(tmp_path / "d.tfrecord", images, labels)
    trainer = ef.Trainer(SmallMLP(), seed=0)
    with pytest.raises(
        ef.errors.DataError,
        match=rf"^{path}: record {N - 1} .*: label 12 is outside the model's 10 outputs",
    ):
        trainer.fit(path, epochs=1, batch_size=8, shuffle=False, verbose=0)


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ("-5 100", "offset -5, size 100"),
        (f"0 {2**63 - 1}", f"offset 0, size {2**63 - 1}"),
        (f"16 {2**63 - 10}", f"offset 16, size {2**63 - 10}"),  # offset + size wraps around
    ],
)
def test_a_tfrecord_index_row_outside_its_file_names_the_index_and_the_line(tmp_path, sample, row, says):
    path = write_tfrecord(tmp_path / "d.tfrecord", sample[0][:5], sample[1][:5])
    lines = open(path + ".idx").read().splitlines()
    lines[2] = row
    with open(path + ".idx", "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(
        ef.errors.DataError,
        match=rf"^{path}.idx: line 3 \(record 2: {says}\) does not lie inside its TFRecord file "
        r".*remake it with DALI's tfrecord2idx, or remove it",
    ):
        ef.data.TFRecord(path)


def test_a_tfrecord_index_number_beyond_int64_names_the_index(tmp_path, sample):
    path = write_tfrecord(tmp_path / "d.tfrecord", sample[0][:5], sample[1][:5])
    with open(path + ".idx", "a") as f:
        f.write(f"0 {2**63}\n")
    with pytest.raises(ef.errors.DataError, match=rf"^{path}.idx: not a TFRecord index .*tfrecord2idx"):
        ef.data.TFRecord(path)


def test_a_large_record_image_broken_in_place_after_its_check_is_checked_again(tmp_path):
    rng = np.random.default_rng(0)
    big = encode(rng.integers(0, 255, (300, 300, 3), np.uint8), "jpeg", quality=95)
    assert len(big) > HEAD  # beyond the bytes checked on every feed: its structure once
    small = encode(np.zeros((300, 300, 3), np.uint8), "jpeg")
    tar = write_webdataset(tmp_path / "s.tar", [small, big, small], [0, 1, 2], ext="jpg")
    source = ef.data.WebDataset(tar, image_size=(32, 32))
    source.feed(np.arange(3))  # checked whole, once
    start = open(tar, "rb").read().index(big)
    dqt = start + big.index(b"\xff\xdb")
    with open(tar, "r+b") as f:  # the quantization table's length, past its segment
        f.seek(dqt + 2)
        f.write(b"\xf0\x00")
    with pytest.raises(
        ef.errors.DataError, match=rf"^{tar}: 000001: quantization table segment of a wrong length"
    ):
        source.feed(np.arange(3))
