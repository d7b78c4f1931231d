"""`easyfit check` / `ef.data.check` list every bad file or record in one run (issue 50)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import easyfit as ef
from tests.helpers import ROOT
from tests.helpers.formats import encode, write_parquet, write_tfrecord

IMAGES = [np.full((8, 8, 3), 40 * k, np.uint8) for k in range(6)]


def _folder(root) -> list[str]:
    """``root/{a,b}/<k>.jpg``, 3 images each; the paths in ImageFolder order."""
    paths = []
    for k, image in enumerate(IMAGES):
        path = os.path.join(root, "ab"[k // 3], f"{k}.jpg")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(encode(image, "jpeg"))
        paths.append(path)
    return paths


def _break_three(paths: list[str]) -> list[str]:
    """A truncated JPEG, a file that is not an image and an empty file: their expected lines."""
    raw = open(paths[1], "rb").read()
    with open(paths[1], "wb") as f:
        f.write(raw[: len(raw) // 2])
    with open(paths[3], "wb") as f:
        f.write(b"these are notes, not pixels\n")
    open(paths[5], "wb").close()
    return [
        f"{paths[1]}: truncated JPEG (no end-of-image marker)",
        f"{paths[3]}: not an image (starts with b'these ar')",
        f"{paths[5]}: empty file",
    ]


@pytest.mark.parametrize("children", [None, 0])  # checker processes, or all in this process
def test_every_bad_image_of_a_folder_is_listed_in_one_run(tmp_path, children):
    paths = _folder(tmp_path / "d")
    assert ef.data.check(tmp_path / "d", children=children) == []
    expected = _break_three(paths)
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


@pytest.mark.slow
def test_easyfit_check_prints_every_bad_file_and_exits_non_zero(tmp_path):
    paths = _folder(tmp_path / "data" / "train")
    _folder(tmp_path / "data" / "val")
    expected = _break_three(paths)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "easyfit.cli", "check", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[1:4] == expected
    assert (
        lines[0].startswith(f"checked ImageFolder('{tmp_path / 'data' / 'train'}'")
        and "3 problems" in lines[0]
    )
    assert (
        lines[4].startswith(f"checked ImageFolder('{tmp_path / 'data' / 'val'}'")
        and "no problems" in lines[4]
    )
    assert lines[5].startswith(
        f"3 bad files or records in {tmp_path / 'data'}. Remove or replace these files"
    )
    assert "is_valid_file=" in lines[5] and len(lines) == 6
