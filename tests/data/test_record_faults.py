"""Records that would train wrong or fail obscurely are named (issue 27): labels beyond int32,
float labels where class indices are expected, labels outside the model's outputs in records
fed after the first batch, TFRecord index rows outside their file."""

from __future__ import annotations

import os
import subprocess
import tarfile

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


def test_a_large_record_image_broken_in_place_after_its_check_is_refused_with_its_file(tmp_path):
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
    with pytest.raises(ef.errors.DataError, match=rf"^{tar}: changed since the fit started"):
        source.feed(np.arange(3))


def _holey_png(path: str) -> None:
    """A PNG (stored, not deflated: long runs of zeros) written with holes where a 4 KiB block
    is all zeros, as a file that ``tar -S`` stores sparse."""
    data = encode(np.zeros((128, 128), np.uint8), compress_level=0)
    with open(path, "wb") as f:
        for at in range(0, len(data), 4096):
            block = data[at : at + 4096]
            if len(block) < 4096 or any(block):
                f.seek(at)
                f.write(block)
        f.truncate(len(data))


def _gnu_tar(folder, shard: str, *options: str) -> list[str]:
    """``folder``'s files written to ``shard`` by GNU tar (a real one: ``tarfile`` writes no
    sparse members); the members' names."""
    names = sorted(os.listdir(folder))
    subprocess.run(["tar", *options, "-cf", shard, "-C", str(folder), *names], check=True)
    return names


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_a_sparse_or_hard_linked_webdataset_member_is_refused_by_name(tmp_path, sample, fmt):
    """Read as one byte range, a sparse member is other members' bytes (or, last, past the
    file's end: once said to be a truncated tar); a hard link's bytes are another member's."""
    for at, kind in ((3, "sparse"), (9, "sparse"), (5, "link")):
        folder = tmp_path / f"{kind}{at}"
        folder.mkdir()
        for i in range(10):
            (folder / f"{i:06d}.cls").write_text(str(sample[1][i]))
            if i != at:
                (folder / f"{i:06d}.png").write_bytes(sample[0][i])
        if kind == "sparse":
            _holey_png(str(folder / f"{at:06d}.png"))
        else:
            os.link(folder / f"{at - 1:06d}.png", folder / f"{at:06d}.png")
        shard = str(tmp_path / f"{kind}{at}-{fmt}.tar")
        _gnu_tar(folder, shard, "-S", f"--format={fmt}")
        with tarfile.open(shard) as t:  # as written: else this test tests nothing
            member = t.getmember(f"{at:06d}.png")
            assert member.issparse() if kind == "sparse" else member.islnk()
        says = "a sparse file" if kind == "sparse" else f"a hard link to '{at - 1:06d}.png'"
        with pytest.raises(ef.errors.DataError, match=rf"^{shard}: member {at:06d}.png is {says}"):
            ef.data.WebDataset(shard)


def test_long_names_pax_headers_and_directories_are_read(tmp_path, sample):
    """What ``tarfile``, ``webdataset`` and GNU tar write besides plain files: PAX extended and
    global headers and GNU long-name headers (names past ustar's 100 characters), directories."""
    images, labels = sample[0][:6], sample[1][:6]
    deep = "a-folder-name-long-enough-" * 5  # 130 characters
    folder = tmp_path / "files" / deep
    folder.mkdir(parents=True)
    for i in range(6):
        (folder / f"{i:06d}.png").write_bytes(images[i])
        (folder / f"{i:06d}.cls").write_text(str(labels[i]))
    shards = []
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        shard = str(tmp_path / f"tarfile-{fmt}.tar")
        with tarfile.open(shard, "w", format=fmt, pax_headers={"comment": "written by a test"}) as t:
            t.add(tmp_path / "files" / deep, arcname=deep)  # the directory, then its files
        shards.append(shard)
    for fmt in ("pax", "gnu"):
        shards.append(str(tmp_path / f"gnu-tar-{fmt}.tar"))
        _gnu_tar(tmp_path / "files", shards[-1], f"--format={fmt}")
    for shard in shards:
        with tarfile.open(shard) as t:
            assert any(len(m.name) > 100 for m in t) and any(m.isdir() for m in t)
        source = ef.data.WebDataset(shard)
        order = [int(k[-6:]) for k in source.keys]  # GNU tar adds a folder's files unsorted
        assert sorted(order) == list(range(6)) and source.keys[0].startswith(deep), shard
        fed, fed_labels = source.feed(np.arange(6))
        assert [bytes(a) for a in fed] == [images[i] for i in order], shard
        assert fed_labels.tolist() == [labels[i] for i in order], shard
