"""`easyfit check` and `ef.data.check` list every bad file or record in one run."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import easyfit as ef
from tests.helpers.formats import (
    break_three,
    encode,
    write_folder,
    write_npy_folder,
    write_parquet,
    write_tfrecord,
)

IMAGES = [np.full((8, 8, 3), 40 * k, np.uint8) for k in range(6)]


@pytest.mark.parametrize("children", [None, 0])  # checker processes, or all in this process
def test_every_bad_image_of_a_folder_is_listed_in_one_run(tmp_path, children):
    paths = write_folder(tmp_path / "d")
    assert ef.data.check(tmp_path / "d", children=children) == []
    expected = break_three(paths)
    # the folder's images are all sampled at construction, where the first bad one stops a fit
    with pytest.raises(ef.errors.DataError):
        ef.data.ImageFolder(tmp_path / "d")
    assert ef.data.check(tmp_path / "d", children=children) == expected


def test_every_bad_record_of_tfrecord_and_parquet_files_is_listed(tmp_path):
    images = [encode(image, "jpeg") for image in IMAGES]
    images[2] = images[2][: len(images[2]) // 2]  # truncated JPEG inside a whole record
    path = write_tfrecord(tmp_path / "t.tfrecord", images, list(range(6)))
    start = int(open(path + ".idx").read().split("\n")[4].split()[0])
    raw = bytearray(open(path, "rb").read())
    raw[start + 12 + 20] ^= 0xFF  # a byte of record 4's data: its CRC fails
    open(path, "wb").write(bytes(raw))
    found = ef.data.check(path)
    assert (
        found[0]
        == f"{path}: record 2 (byte offset {_offset(path, 2)}): truncated JPEG (no end-of-image marker)"
    )
    assert found[1].startswith(
        f"{path}: record 4 (byte offset {start}): the CRC-32C of its data does not match"
    )
    assert len(found) == 2

    images = [encode(image, "png") for image in IMAGES]
    images[1], images[4] = b"not an image at all", b""
    table = write_parquet(tmp_path / "p.parquet", images, list(range(6)), row_group_size=4)
    assert ef.data.check(table) == [
        f"{table}: row group 0, row 1: not an image (starts with b'not an i')",
        f"{table}: row group 1, row 4: empty image (0 bytes)",
    ]


def _offset(path: str, record: int) -> int:
    return int(open(path + ".idx").read().split("\n")[record].split()[0])


def test_the_images_of_records_are_checked_alike_in_children_and_here():
    from easyfit.data.check_pool import image_problems

    good, bad = encode(IMAGES[0], "png"), b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13)
    chunks = [([0, 1], [good, bad]), ([2], [b"GIF89a..."]), ([3, 4], [good, good])]
    expected = {1: "truncated PNG (no IEND chunk)", 2: "not an image"}
    for children in (2, 0):
        found = image_problems(iter(chunks), children)
        assert sorted(found) == [1, 2] and found[1].startswith("truncated PNG"), found
        assert found[2].startswith(expected[2])


def test_every_bad_file_of_a_numpy_folder_is_listed(tmp_path):
    root = write_npy_folder(tmp_path / "n", np.ones((6, 4, 4, 1), np.float32), [0, 0, 0, 1, 1, 1])
    files = ef.data.NumpyFolder(root).files
    with open(files[1], "wb") as f:  # read as the folder is built, where a fit stops at it
        f.write(b"junk")
    np.save(files[2], np.full((4, 4, 1), np.nan, np.float32))
    raw = open(files[4], "rb").read()
    with open(files[4], "wb") as f:
        f.write(raw[:-10])
    open(files[5], "wb").close()
    assert ef.data.check(root) == [
        f"{files[1]}: not a NumPy .npy file (EOF: reading magic string, expected 8 bytes got 4)",
        f"{files[2]}: holds NaN or inf (first at element 0)",
        f"{files[4]}: truncated .npy file ({len(raw) - 10} of {len(raw)} bytes)",
        f"{files[5]}: empty file",
    ]
