"""save() replaces only what easyfit wrote (a marker file says so), and any path is saved and
loaded back: brackets, spaces, non-ASCII names."""

from __future__ import annotations

import os
import shutil

import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.persistence import checkpoint_files as _integrity
from tests.helpers import flat_params
from tests.helpers.models import SmallMLP


@pytest.fixture(scope="module")
def trained():
    x, y = ef.datasets.sample()["train"]
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=3, steps_per_execution=1)
    trainer.fit(ef.data.Arrays(x[:200], y[:200], scale=1 / 255), epochs=1, batch_size=100, verbose=0)
    return trainer


def _load(path):
    return ef.Trainer.from_checkpoint(path, SmallMLP(), optimizer=optax.adam(1e-3))


def _canary(folder, name="notes.txt", text="mine"):
    os.makedirs(folder, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def test_save_refuses_a_directory_that_is_not_a_checkpoint(trained, tmp_path):
    target = tmp_path / "results"
    canary = _canary(target)
    with pytest.raises(ef.CheckpointError, match=r"results: is a directory that is not an easyfit"):
        trained.save(target)
    assert canary.read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["results"]  # nothing written beside it either


def test_save_refuses_a_regular_file(trained, tmp_path):
    target = tmp_path / "model.bin"
    target.write_bytes(b"\x00user data")
    with pytest.raises(ef.CheckpointError, match=r"model.bin: is a file, not an easyfit.*another path"):
        trained.save(target)
    assert target.read_bytes() == b"\x00user data"
    assert sorted(os.listdir(tmp_path)) == ["model.bin"]


def test_save_refuses_a_user_directory_in_the_way_of_the_swap(trained, tmp_path):
    canary = _canary(tmp_path / "ckpt.easyfit-old")
    with pytest.raises(ef.CheckpointError, match=r"ckpt.easyfit-old: is a directory that is not"):
        trained.save(tmp_path / "ckpt")
    assert canary.read_text() == "mine"


def test_save_replaces_its_own_checkpoint_atomically_and_marks_it(trained, tmp_path):
    canary = _canary(tmp_path)  # a neighbour of the checkpoint
    path = trained.save(tmp_path / "ckpt")
    assert os.path.isfile(os.path.join(path, _integrity.MARKER))
    assert trained.save(path) == path  # replaced: it carries the marker
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "notes.txt"]  # no staging or swap leftovers
    assert canary.read_text() == "mine"
    assert np.array_equal(flat_params(_load(path).params), flat_params(trained.params))


def test_a_checkpoint_from_before_the_marker_is_recognised_by_its_metadata(trained, tmp_path):
    path = trained.save(tmp_path / "ckpt")
    os.remove(os.path.join(path, _integrity.MARKER))  # as an older easyfit wrote it
    assert _integrity.owned(path)
    trained.save(path)
    assert os.path.isfile(os.path.join(path, _integrity.MARKER))
    # a directory with a "metadata" item of another format is not ours
    other = tmp_path / "other"
    _canary(other / "metadata", "metadata", '{"format": "something-else"}')
    assert not _integrity.owned(str(other))
    with pytest.raises(ef.CheckpointError, match="not an easyfit checkpoint"):
        trained.save(other)
    assert (other / "metadata" / "metadata").read_text() == '{"format": "something-else"}'


def test_an_empty_directory_is_a_valid_target(trained, tmp_path):
    (tmp_path / "ckpt").mkdir()  # nothing to lose: e.g. made by mkdtemp or the user beforehand
    path = trained.save(tmp_path / "ckpt")
    assert _load(path).state.step == trained.state.step


def test_a_symlink_target_is_refused(trained, tmp_path):
    real = trained.save(tmp_path / "real")
    os.symlink(real, tmp_path / "link")
    with pytest.raises(ef.CheckpointError, match="is a symbolic link"):
        trained.save(tmp_path / "link")
    assert os.path.islink(tmp_path / "link")


NAMES = ["runs/lr[0.1]/ckpt", "runs/a b/ckpt", "runs/ünïcödé/模型", "runs/[x]/c[1]*?"]


@pytest.mark.parametrize("name", NAMES)
def test_any_path_is_saved_and_loaded_back(trained, tmp_path, name):
    # brackets: Orbax globs for its OCDBT parts, and lost the manifest under such a path
    canary = _canary(tmp_path / "runs")
    path = trained.save(tmp_path / name)
    assert path == str(tmp_path / name)
    again = _load(path)
    assert np.array_equal(flat_params(again.params), flat_params(trained.params))
    assert ef.checkpoint.verify(path)["step"] == int(trained.state.step)
    assert canary.read_text() == "mine"
    leftovers = [d for _, ds, fs in os.walk(tmp_path) for d in ds + fs if ".easyfit-" in d]
    assert leftovers == []


def test_a_leftover_staging_directory_is_removed_only_with_its_marker(trained, tmp_path):
    path = str(tmp_path / "ckpt")
    staging = _integrity.staging_dir(path)
    _canary(tmp_path / os.path.basename(staging))  # a user's directory of that very name
    with pytest.raises(ef.CheckpointError, match="not made by easyfit"):
        trained.save(path)
    assert (tmp_path / os.path.basename(staging) / "notes.txt").read_text() == "mine"
    shutil.rmtree(staging)
    os.makedirs(os.path.join(staging, "checkpoint", "state"))  # a save killed while writing
    _integrity.write_marker(staging, _integrity.STAGING_MARKER)
    trained.save(path)
    assert not os.path.exists(staging)


def test_a_users_file_named_like_the_lock_is_left_alone(trained, tmp_path):
    lock = tmp_path / "ckpt.lock"
    lock.write_text("my notes about the lock\n")
    with pytest.raises(ef.CheckpointError, match=r"ckpt.lock exists and is not an easyfit lock file"):
        trained.save(tmp_path / "ckpt")
    assert lock.read_text() == "my notes about the lock\n"
    lock.write_text("12345\n")  # one a killed writer left: taken over
    trained.save(tmp_path / "ckpt")
    assert not lock.exists()
