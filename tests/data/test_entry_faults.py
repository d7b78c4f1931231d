"""Entries that cannot be read are named, never skipped (issue 27): broken symlinks and
unreadable folders of an image folder, WebDataset members that are links or devices."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

import pytest

import easyfit as ef
from tests.helpers import ROOT, last_json, run_program
from tests.helpers.formats import encode


@pytest.fixture
def folder(tmp_path, mnist_arrays):
    x, _ = mnist_arrays["train"]
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(3):
            (tmp_path / c / f"{i}.png").write_bytes(encode(x[i]))
    return tmp_path


def test_a_broken_symlink_in_a_class_folder_is_named(folder):
    link = folder / "b" / "3.png"
    os.symlink(folder / "gone.png", link)
    with pytest.raises(
        ef.errors.DataError,
        match=f"^{link}: cannot be followed .No such file or directory.; a symbolic link to "
        f"'{folder}/gone.png': fix or remove it",
    ):
        ef.data.ImageFolder(folder)


def test_a_symlinked_image_is_followed(folder):
    os.symlink(folder / "a" / "0.png", folder / "b" / "3.png")
    assert len(ef.data.ImageFolder(folder)) == 7


_DROP = """
import os, sys
import easyfit as ef
root = sys.argv[1]
if os.geteuid() == 0:  # root reads a folder of mode 000: become nobody
    os.setgid(65534)
    os.setuid(65534)
try:
    ef.data.ImageFolder(root)
except ef.errors.DataError as e:
    print(e)
"""


@pytest.mark.slow
def test_an_unreadable_class_folder_is_named(mnist_arrays):
    base = tempfile.mkdtemp(dir="/tmp")  # reachable by the unprivileged user the program becomes
    try:
        os.chmod(base, 0o755)
        x, _ = mnist_arrays["train"]
        for c in ("a", "b"):
            os.makedirs(os.path.join(base, c), mode=0o755)
            with open(os.path.join(base, c, "0.png"), "wb") as f:
                f.write(encode(x[0]))
        os.chmod(os.path.join(base, "b"), 0)
        proc = subprocess.run(
            [sys.executable, "-c", _DROP, base], capture_output=True, text=True, timeout=300
        )
    finally:
        os.chmod(os.path.join(base, "b"), 0o755)
        shutil.rmtree(base)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(
        f"{base}/b: cannot be listed (Permission denied); give the user who trains read"
    ), proc.stdout + proc.stderr[-2000:]


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        (tarfile.SYMTYPE, "a symbolic link to '000000.png'"),
        (tarfile.LNKTYPE, "a hard link to '000000.png'"),
        (tarfile.CHRTYPE, "a device node"),
        (tarfile.FIFOTYPE, "a FIFO"),
    ],
)
def test_a_webdataset_image_member_that_is_no_regular_file_is_named(tmp_path, mnist_arrays, kind, says):
    x, _ = mnist_arrays["train"]
    shard = str(tmp_path / "s.tar")
    with tarfile.open(shard, "w") as t:
        for i in range(20):
            for name, data in ((f"{i:06d}.png", encode(x[i])), (f"{i:06d}.cls", b"1")):
                info = tarfile.TarInfo(name)
                if i == 7 and name.endswith(".png"):
                    info.type, info.linkname = kind, "000000.png"
                    t.addfile(info)
                    continue
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    with pytest.raises(ef.errors.DataError, match=f"^{shard}: member 000007.png is {says}, not a plain file"):
        ef.data.WebDataset(shard)


@pytest.mark.slow
def test_a_jpeg_replaced_by_a_broken_one_between_epochs_is_named_in_every_run(tmp_path, mnist_arrays):
    x, y = mnist_arrays["train"]
    for i in range(100):
        os.makedirs(tmp_path / str(y[i]), exist_ok=True)
        (tmp_path / str(y[i]) / f"{i:03d}.jpg").write_bytes(encode(x[i], "jpeg", quality=90))
    env = {"PYTHONPATH": str(ROOT)}  # this checkout's easyfit
    out = last_json(run_program("replaced_between_epochs.py", str(tmp_path), "3", env=env))
    assert (
        out["results"]
        == [
            f"{out['path']}: JPEG segment FFDB at byte 20 has length 61440, past the end of the file"
            f" ({os.path.getsize(out['path'])} bytes) (to list every bad file at once: easyfit check "
            f"{tmp_path})"
        ]
        * 3
    )
