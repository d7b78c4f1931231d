"""Files easyfit writes into a user's path are written whole or not at all (easyfit/_files.py):
a write that fails (a full disk) leaves the file there before as it was."""

from __future__ import annotations

import os
import stat

import jax.numpy as jnp
import numpy as np
import pytest

from easyfit._files import STAGING, check_writable, write_files
from easyfit.callbacks import CSVLogger
from easyfit.callbacks._plot import plot_history
from easyfit.datasets import write_png
from easyfit.persistence.export import export, load_exported
from tests.helpers import last_json, run_program


def _tree(folder) -> dict[str, bytes]:
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = f.read()
    return found


@pytest.mark.slow
def test_every_writer_leaves_the_previous_file_whole_when_the_disk_is_full(tmp_path):
    """A re-export, CSVLogger (appending or not), History.plot, write_png and TensorBoard, each under a
    file size limit its new file exceeds (a real write failing with EFBIG, in a child
    process): every file written before is byte for byte as it was, the previous export still
    loads and computes what it did, each error names its file, and no staging file is left."""
    export(tmp_path / "export", lambda x: x * 2.0, (4,), "float32")
    for name in ("append.csv", "fresh.csv"):
        logger = CSVLogger(tmp_path / name)
        logger.on_train_begin()
        logger.on_epoch_end(0, {"loss": 0.5, "accuracy": 0.75})
        logger.on_train_end()
    plot_history({"loss": [0.9, 0.5], "val_loss": [0.8, 0.6]}, [0, 1], tmp_path / "curves.png")
    write_png(tmp_path / "image.png", np.zeros((4, 4), np.uint8))
    before = _tree(tmp_path)

    errors = last_json(run_program("disk_full.py", str(tmp_path)))

    after = _tree(tmp_path)
    assert [name for name, content in before.items() if after.get(name) != content] == []
    events = {n: c for n, c in after.items() if n.startswith(os.path.join("logs", "train", ""))}
    earlier = {n: c for n, c in events.items() if c == f"earlier run {os.path.basename(n)}".encode()}
    assert len(earlier) == 11 and len(events) == 12  # none reopened; TensorBoard's, named anew
    assert [n for n in after if STAGING in n] == []
    function, meta = load_exported(tmp_path / "export")
    np.testing.assert_allclose(function(jnp.ones((3, 4))), 2.0, rtol=0)  # the old function
    assert meta["input_shape"] == [None, 4]
    for writer, path in {
        "export": "export/model.stablehlo",
        "csv_append": "append.csv",
        "csv_fresh": "fresh.csv",
        "plot": "curves.png",
        "png": "image.png",
    }.items():
        assert errors[writer] is not None and str(tmp_path / path) in errors[writer], errors
        assert "File too large" in errors[writer] and "left as it was" in errors[writer]
    if errors["tensorboard"] is not None:  # raised where the writer's thread met it first
        assert str(tmp_path / "logs" / "train") in errors["tensorboard"], errors


def test_files_written_together_are_renamed_only_once_all_are_written(tmp_path):
    """A file that cannot be written (here: its path is a folder's) stops the others too: none
    is replaced, none of their staging files stays; a link has its target replaced, keeping
    that file's mode."""
    first, second = tmp_path / "a.bin", tmp_path / "b"
    first.write_bytes(b"old")
    second.mkdir()
    (second / "inside").write_bytes(b"untouched")
    with pytest.raises(OSError, match=f"{second}: not written .*left as it was"):
        write_files({str(first): b"new", str(second): b"new"})
    assert first.read_bytes() == b"old" and (second / "inside").read_bytes() == b"untouched"
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b"]
    with pytest.raises(IsADirectoryError, match=f"{second}: not written"):
        check_writable(str(second))  # what CSVLogger asks as fit begins
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b"]
    first.chmod(0o640)
    link = tmp_path / "link"
    link.symlink_to(first)
    write_files({str(link): b"through the link"})
    assert link.is_symlink() and first.read_bytes() == b"through the link"
    assert stat.S_IMODE(first.stat().st_mode) == 0o640


def test_only_easyfit_s_own_staging_files_are_ever_removed(tmp_path):
    """Canaries beside the target, one named as a staging file would be: neither a write, a
    failed write nor the writability check removes or changes them."""
    canaries = {tmp_path / "notes.txt": b"mine", tmp_path / ".a.bin.easyfit-tmp-00000000": b"mine too"}
    for path, data in canaries.items():
        path.write_bytes(data)
    (tmp_path / "dir").mkdir()
    write_files({str(tmp_path / "a.bin"): b"new"})
    check_writable(str(tmp_path / "a.bin"))
    with pytest.raises(OSError):
        write_files({str(tmp_path / "a.bin"): b"newer", str(tmp_path / "dir"): b"x"})
    assert (tmp_path / "a.bin").read_bytes() == b"new"
    assert all(path.read_bytes() == data for path, data in canaries.items())
    assert sorted(os.listdir(tmp_path)) == sorted(["a.bin", "dir", *(p.name for p in canaries)])
