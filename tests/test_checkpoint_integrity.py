"""Checkpoints that cannot mislead: checksums, named errors, atomic swaps, one writer, fallback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.callbacks import BackupAndRestore
from easyfit.callbacks.backup_and_restore import BACKUPS, BACKUPS_MARKER
from tests.helpers import flat_params
from tests.helpers.models import SmallMLP


@pytest.fixture(scope="module")
def data():
    x, y = ef.datasets.sample()["train"]
    return ef.data.Arrays(x[:300], y[:300], scale=1 / 255)


def _trainer():
    return ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=3, steps_per_execution=1)


def _fit(trainer, data, callbacks=(), epochs=1):
    return trainer.fit(data, epochs=epochs, batch_size=100, verbose=0, callbacks=list(callbacks))


@pytest.fixture(scope="module")
def saved(data, tmp_path_factory):
    """A trainer after one epoch and a pristine checkpoint of it (copied by each test)."""
    trainer = _trainer()
    _fit(trainer, data)
    path = trainer.save(tmp_path_factory.mktemp("pristine") / "ckpt")
    return trainer, path


@pytest.fixture()
def ckpt(saved, tmp_path):
    path = tmp_path / "ckpt"
    shutil.copytree(saved[1], path)
    return str(path)


def _load(path):
    return ef.Trainer.from_checkpoint(path, SmallMLP(), optimizer=optax.adam(1e-3))


def _largest_array_file(path):
    """The biggest data file Orbax wrote for the state (OCDBT: ``state/**/d/<hash>``)."""
    files = [
        os.path.join(d, f)
        for d, _, fs in os.walk(os.path.join(path, "state"))
        if os.path.basename(d) == "d"
        for f in fs
    ]
    return max(files, key=os.path.getsize)


def _flip(file, count=16):
    with open(file, "r+b") as f:
        raw = bytearray(f.read())
        middle = len(raw) // 2
        for i in range(middle, middle + count):
            raw[i] ^= 0xFF
        f.seek(0)
        f.write(raw)


def test_a_checkpoint_carries_checksums_and_loads_exactly(saved, ckpt):
    trainer, _ = saved
    assert ef.checkpoint.verify(ckpt)["epoch"] == 1
    assert os.path.isdir(os.path.join(ckpt, "checksums"))
    assert np.array_equal(flat_params(_load(ckpt).params), flat_params(trainer.params))


def test_flipped_bytes_in_an_array_file_are_refused(ckpt):
    _flip(_largest_array_file(ckpt))
    for attempt in (lambda: _load(ckpt), lambda: ef.checkpoint.verify(ckpt)):
        with pytest.raises(ef.CheckpointError, match=rf"{ckpt}: item 'state'"):
            attempt()


def test_an_edited_epoch_is_refused(ckpt):
    file = os.path.join(ckpt, "metadata", "metadata")
    meta = json.loads(open(file).read())
    meta["epoch"] = 7
    with open(file, "w") as f:
        json.dump(meta, f)
    with pytest.raises(ef.CheckpointError, match=rf"{ckpt}: item 'metadata' does not match"):
        ef.checkpoint.read_metadata(ckpt)


@pytest.mark.parametrize("damage", ["truncated", "missing", "garbage-metadata", "no-checksums"])
def test_truncated_missing_and_garbage_raise_a_named_error(ckpt, damage):
    if damage == "truncated":
        file = _largest_array_file(ckpt)
        os.truncate(file, os.path.getsize(file) // 2)
        part = "state"
    elif damage == "missing":
        os.remove(_largest_array_file(ckpt))
        part = "state"
    elif damage == "garbage-metadata":
        with open(os.path.join(ckpt, "metadata", "metadata"), "w") as f:
            f.write("{not json")
        part = "metadata"
    else:
        shutil.rmtree(os.path.join(ckpt, "checksums"))
        part = "checksums"
    with pytest.raises(ef.CheckpointError, match=rf"{ckpt}: item '{part}'"):
        ef.checkpoint.verify(ckpt)
    with pytest.raises(ef.CheckpointError, match=rf"{ckpt}: item '{part}'"):
        _load(ckpt)


def test_a_kill_between_the_two_renames_is_recovered(saved, ckpt):
    # save() renames path -> path.easyfit-old, then path.easyfit-new -> path: killed between
    shutil.copytree(ckpt, ckpt + ".easyfit-old")
    os.rename(ckpt, ckpt + ".easyfit-new")
    assert ef.checkpoint.read_metadata(ckpt)["epoch"] == 1  # loads the complete new one
    restored = _load(ckpt)
    assert np.array_equal(flat_params(restored.params), flat_params(saved[0].params))
    restored.save(ckpt)  # the next save puts things back in place
    parent = os.path.dirname(ckpt)
    assert sorted(os.listdir(parent)) == ["ckpt"]


_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1] + ".lock", os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_a_second_writer_is_refused_and_touches_nothing(saved, ckpt):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, ckpt], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = sorted(os.listdir(os.path.dirname(ckpt)))
        with pytest.raises(ef.CheckpointError, match=rf"{ckpt}: another writer holds"):
            saved[0].save(ckpt)
        assert sorted(os.listdir(os.path.dirname(ckpt))) == before
        assert ef.checkpoint.verify(ckpt)["epoch"] == 1
    finally:
        holder.kill()
        holder.wait()
    saved[0].save(ckpt)  # free again


def test_a_second_fit_on_a_backup_dir_does_not_delete_the_first_ones_save(tmp_path, data):
    backup = tmp_path / "backup"
    first = BackupAndRestore(backup)
    first.on_train_begin()  # the first fit runs: it holds the directory
    in_progress = backup / BACKUPS / "3.orbax-checkpoint-tmp-1700000000"  # its save being written
    os.makedirs(in_progress / "state")
    (backup / BACKUPS / BACKUPS_MARKER).write_text('{"format": "easyfit-backups"}')  # as it made it
    with pytest.raises(ef.CheckpointError, match="another writer holds"):
        _fit(_trainer(), data, [BackupAndRestore(backup, save_freq=1)])
    assert in_progress.is_dir()
    first.on_train_end()  # (no manager opened: it only lets go)
    _fit(_trainer(), data, [BackupAndRestore(backup)])  # free again


def test_backup_falls_back_to_the_newest_intact_one(tmp_path, data, capsys):
    backup = tmp_path / "backup"
    trainer = _trainer()
    backup_and_restore = BackupAndRestore(
        backup, save_freq=1, double_checkpoint=True, delete_checkpoint=False
    )
    _fit(trainer, data, [backup_and_restore])
    steps = sorted(int(n) for n in os.listdir(backup / BACKUPS) if n.isdigit())
    assert len(steps) == 2  # the two latest are kept (double_checkpoint)
    newest, older = (str(backup / BACKUPS / str(s)) for s in steps[::-1])
    _flip(_largest_array_file(newest))
    with pytest.warns(RuntimeWarning, match=rf"backup {newest} is damaged"):
        point = BackupAndRestore(backup).restore_point()
    assert f"backup {newest} is damaged" in capsys.readouterr().out
    assert point.source.endswith(f"(backup {steps[0]})")
    assert (point.epoch, point.batch) == (0, 2)  # the backup after batch 2 of 3
    assert sorted(os.listdir(backup / BACKUPS)) == sorted(
        [BACKUPS_MARKER, str(steps[0]), f"damaged-{steps[1]}"]
    )
    # a fit resumes from it and ends where an uninterrupted one does
    resumed = _trainer()  # (no backup written after the resume: save_freq is 100 batches)
    _fit(resumed, data, [BackupAndRestore(backup, save_freq=100)])
    assert np.array_equal(flat_params(resumed.params), flat_params(trainer.params))
    assert not backup.exists()  # training finished: the backup directory goes
