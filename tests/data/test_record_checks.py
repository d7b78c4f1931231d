"""Damaged records are named, never trained on (issue 17): TFRecord CRCs, RecordIO framing."""

from __future__ import annotations

import struct
import tarfile

import numpy as np
import pytest

import easyfit as ef
from easyfit.data import Loader
from tests.helpers.formats import encode, write_recordio, write_tfrecord, write_webdataset

N = 12
BAD = 7  # the damaged record


@pytest.fixture(scope="module")
def sample(mnist_arrays):
    x, y = mnist_arrays["train"]
    y = y[:N].copy()
    y[BAD] = 3
    return [encode(a) for a in x[:N]], y


def _all_labels(source) -> np.ndarray:
    plan = ef.data.Plan(source.num_samples, source.num_samples, shuffle=False)
    loader = Loader(source, plan, ef.trainer.Placement.create())
    try:
        return np.asarray(next(loader)["y"])
    finally:
        loader.close()


def _patch(path: str, offset: int, new: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(new)


def _tfrecord_offsets(path: str) -> list[int]:
    return [int(line.split()[0]) for line in open(path + ".idx")]


def test_a_tfrecord_label_changed_3_to_4_is_refused_by_its_data_crc(tmp_path, sample):
    path = write_tfrecord(tmp_path / "d.tfrecord", *sample)
    np.testing.assert_array_equal(_all_labels(ef.data.TFRecord(path)), sample[1])
    start = _tfrecord_offsets(path)[BAD]
    raw = open(path, "rb").read()
    label = raw.index(b"\x1a\x03\x0a\x01\x03", start)  # int64_list { value: 3 }
    _patch(path, label + 4, b"\x04")
    with pytest.raises(
        ef.errors.DataError,
        match=f"^{path}: record {BAD} .byte offset {start}.: the CRC-32C of its data does not match",
    ):
        _all_labels(ef.data.TFRecord(path))


def test_a_damaged_tfrecord_length_is_refused_by_its_crc(tmp_path, sample):
    path = write_tfrecord(tmp_path / "d.tfrecord", *sample)
    start = _tfrecord_offsets(path)[BAD]
    _patch(path, start + 8, b"\0\0\0\0")  # the CRC of the length field
    with pytest.raises(
        ef.errors.DataError, match=f"^{path}: record {BAD} .byte offset {start}.: the CRC of its length field"
    ):
        _all_labels(ef.data.TFRecord(path))


def test_a_recordio_record_with_a_damaged_magic_is_named_with_its_offset(tmp_path, sample):
    rec = write_recordio(tmp_path / "d.rec", *sample)
    start = [int(line.split()[1]) for line in open(tmp_path / "d.idx")][BAD]
    _patch(rec, start, b"\0\0\0\0")
    with pytest.raises(ef.errors.DataError, match=f"^{rec}: not a RecordIO record at byte offset {start} "):
        ef.data.RecordIO(rec)


def test_a_recordio_length_past_the_next_record_is_named_with_its_offset(tmp_path, sample):
    rec = write_recordio(tmp_path / "d.rec", *sample)
    start = [int(line.split()[1]) for line in open(tmp_path / "d.idx")][BAD]
    word = struct.unpack_from("<I", open(rec, "rb").read(), start + 4)[0]
    _patch(rec, start + 4, struct.pack("<I", word + 64))
    with pytest.raises(ef.errors.DataError, match=f"^{rec}: .*byte offset {start}"):
        ef.data.RecordIO(rec)


@pytest.mark.parametrize("cut", ["inside an image", "after a label's data", "at a member's end"])
def test_a_truncated_webdataset_shard_is_reported_as_truncated(tmp_path, sample, cut):
    tar = write_webdataset(tmp_path / "d.tar", *sample)
    with tarfile.open(tar) as t:
        image, label = t.getmembers()[2 * BAD : 2 * BAD + 2]  # the members of record BAD
    raw = open(tar, "rb").read()
    end = {
        "inside an image": image.offset_data + 10,
        "after a label's data": label.offset_data + label.size,
        "at a member's end": label.offset_data + 512,
    }[cut]
    with open(tar, "wb") as f:
        f.write(raw[:end])
    with pytest.raises(ef.errors.DataError, match=f"^{tar}: truncated tar file"):
        ef.data.WebDataset(tar)
