"""BackupAndRestore deletes only its own backups, and only after a fit that returned; it resumes
only on the data it backed up; a failing fit never leaves its lock behind."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.callbacks import BackupAndRestore, CSVLogger, LambdaCallback, ModelCheckpoint
from easyfit.callbacks.backup_and_restore import BACKUPS
from easyfit.persistence.checkpoint import verify
from easyfit.persistence.checkpoint_files import complete
from tests.helpers import Crash, crash_at
from tests.helpers.models import SmallMLP


@pytest.fixture(scope="module")
def data(mnist_arrays):
    x, y = mnist_arrays["train"]
    return ef.data.Arrays(x[:200], y[:200], scale=1 / 255)


def _trainer():
    return ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=1, steps_per_execution=1)


def _fit(trainer, data, callbacks, epochs=2):
    return trainer.fit(data, epochs=epochs, batch_size=100, verbose=0, callbacks=callbacks)


def _user_files(backup_dir):
    os.makedirs(backup_dir, exist_ok=True)
    (backup_dir / "config.yaml").write_text("lr: 0.1\n")
    return backup_dir / "config.yaml"


@pytest.mark.parametrize("empty", ["", None, "   "])
def test_an_empty_or_none_backup_dir_is_refused(empty, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    canary = _user_files(tmp_path)
    with pytest.raises(ValueError, match="empty backup_dir"):
        BackupAndRestore(empty)
    assert canary.read_text() == "lr: 0.1\n"


def test_a_backup_dir_with_glob_characters_or_that_is_a_file_is_refused_before_writing(tmp_path):
    for name in ("lr[0.1]", "run*", "run?"):  # every character the docstring names
        with pytest.raises(ValueError, match=r"glob character"):
            BackupAndRestore(tmp_path / name / "backup")
        assert not (tmp_path / name).exists()
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        BackupAndRestore(tmp_path / "f")


def test_a_successful_fit_removes_only_its_backups(tmp_path, data):
    backup_dir = tmp_path / "run"
    config = _user_files(backup_dir)
    log = backup_dir / "log.csv"
    history = _fit(_trainer(), data, [CSVLogger(log), BackupAndRestore(backup_dir, save_freq=1)])
    assert history.epoch == [0, 1]
    assert sorted(os.listdir(backup_dir)) == ["config.yaml", "log.csv"]  # the backups went
    assert config.read_text() == "lr: 0.1\n"
    assert len(log.read_text().splitlines()) == 3  # header and two epochs


def test_a_directory_named_like_a_step_is_never_touched(tmp_path, data):
    # Orbax's max_to_keep deletes step directories by name: the backups live in a marked
    # subdirectory, so a user's "5/" beside them stays
    backup_dir = tmp_path / "run"
    os.makedirs(backup_dir / "5")
    (backup_dir / "5" / "keep.txt").write_text("mine")
    _fit(_trainer(), data, [BackupAndRestore(backup_dir, save_freq=1)], epochs=3)
    assert (backup_dir / "5" / "keep.txt").read_text() == "mine"


def test_a_backup_dir_made_by_the_callback_is_removed_when_left_empty(tmp_path, data):
    _fit(_trainer(), data, [BackupAndRestore(tmp_path / "fresh")])
    assert not (tmp_path / "fresh").exists()


def test_an_unmarked_backups_directory_is_refused_and_kept(tmp_path, data):
    backup_dir = tmp_path / "run"
    os.makedirs(backup_dir / BACKUPS)
    (backup_dir / BACKUPS / "mine.txt").write_text("mine")
    with pytest.raises(ef.CheckpointError, match="not made by easyfit"):
        _fit(_trainer(), data, [BackupAndRestore(backup_dir)])
    assert (backup_dir / BACKUPS / "mine.txt").read_text() == "mine"


def _fail_on_train_end(logs):
    raise RuntimeError("on_train_end failed")


@pytest.mark.parametrize("first", [True, False])
def test_a_fit_failing_after_its_last_epoch_keeps_the_backup(tmp_path, data, first):
    # the failing callback before or after BackupAndRestore in the list: either way nothing goes
    backup_dir = tmp_path / "run"
    canary = _user_files(backup_dir)
    failing = LambdaCallback(on_train_end=_fail_on_train_end)
    backup = BackupAndRestore(backup_dir)
    with pytest.raises(RuntimeError, match="on_train_end failed"):
        _fit(_trainer(), data, [failing, backup] if first else [backup, failing])
    point = BackupAndRestore(backup_dir).restore_point()
    assert (point.epoch, point.batch) == (2, 0)  # the final state survives
    assert canary.read_text() == "lr: 0.1\n"


def test_a_model_checkpoint_path_that_is_a_file_keeps_the_backup(tmp_path, data):
    backup_dir = tmp_path / "run"
    target = tmp_path / "best2"  # epoch 2's path: the backup of epoch 1 is written before
    target.write_text("a file of the user's")
    checkpoint = ModelCheckpoint(tmp_path / "best{epoch}")
    with pytest.raises(ef.CheckpointError, match="is a file"):
        _fit(_trainer(), data, [BackupAndRestore(backup_dir), checkpoint], epochs=2)
    assert target.read_text() == "a file of the user's"
    assert BackupAndRestore(backup_dir).restore_point().epoch == 1


def test_a_failure_in_on_train_begin_releases_the_lock(tmp_path, data):
    backup_dir = tmp_path / "run"

    def fail(logs):
        raise RuntimeError("on_train_begin failed")

    first = BackupAndRestore(backup_dir)  # still referenced (its lock would go with it otherwise)
    with pytest.raises(RuntimeError, match="on_train_begin failed"):
        _fit(_trainer(), data, [first, LambdaCallback(on_train_begin=fail)])
    assert not os.path.exists(str(backup_dir) + ".lock")
    assert _fit(_trainer(), data, [BackupAndRestore(backup_dir)]).epoch == [0, 1]  # the retry runs
    assert first.backup_dir == str(backup_dir)


def test_a_backup_dir_deleted_mid_run_gives_an_error_naming_it(tmp_path, data):
    backup_dir = tmp_path / "run"

    def delete(epoch, logs):
        if epoch == 1:  # after epoch 0's backup, before epoch 1's (it may still be writing)
            while backup_dir.exists():
                shutil.rmtree(backup_dir, ignore_errors=True)

    with pytest.raises(ef.CheckpointError, match=rf"{backup_dir}.*was deleted while fit was running"):
        _fit(_trainer(), data, [LambdaCallback(on_epoch_end=delete), BackupAndRestore(backup_dir)], epochs=3)
    assert not os.path.exists(str(backup_dir) + ".lock")


def _folder(root, classes, count, size=8):
    from PIL import Image

    rng = np.random.default_rng(len(classes) + count + size)
    for name in classes:
        os.makedirs(root / name)
        for i in range(count):
            pixels = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return str(root)


def test_resuming_on_another_folder_names_what_changed(tmp_path):
    a = _folder(tmp_path / "a", ["cat", "dog"], 10)
    b = _folder(tmp_path / "b", ["car", "bus"], 10)  # as many images, other classes
    backup = tmp_path / "backup"
    crashing = _trainer()
    with pytest.raises(Crash):
        crashing.fit(
            a,
            epochs=2,
            batch_size=5,
            verbose=0,
            callbacks=[BackupAndRestore(backup, save_freq=1), crash_at(crashing, 0, 1)],
        )
    with pytest.raises(
        ValueError,
        match=r"not the data the backup was taken on.*class names: \['cat', 'dog'\] -> \['bus', 'car'\]",
    ):
        _trainer().fit(b, epochs=2, batch_size=5, verbose=0, callbacks=[BackupAndRestore(backup)])
    # same class names and count, other images: the files differ
    c = _folder(tmp_path / "c", ["cat", "dog"], 10, size=9)
    with pytest.raises(ValueError, match=r"the files \(their names or sizes\) changed"):
        _trainer().fit(c, epochs=2, batch_size=5, verbose=0, callbacks=[BackupAndRestore(backup)])
    assert BackupAndRestore(backup).restore_point() is not None  # the backup is untouched
    # the same folder moved elsewhere is the same data: it resumes
    moved = shutil.copytree(a, tmp_path / "moved")
    history = _trainer().fit(
        str(moved), epochs=2, batch_size=5, verbose=0, callbacks=[BackupAndRestore(backup)]
    )
    assert history.epoch == [0, 1]


def test_resuming_on_other_arrays_is_refused(tmp_path, data, mnist_arrays):
    backup = tmp_path / "backup"
    crashing = _trainer()
    with pytest.raises(Crash):
        _fit(crashing, data, [BackupAndRestore(backup, save_freq=1), crash_at(crashing, 0, 1)])
    x, y = mnist_arrays["train"]
    other = ef.data.Arrays(x[200:400], y[200:400], scale=1 / 255)
    with pytest.raises(ValueError, match=r"the arrays \(their shapes, dtypes or values\) changed"):
        _fit(_trainer(), other, [BackupAndRestore(backup)])


def test_callbacks_given_as_a_generator_all_run(data):
    seen = []
    gen = (LambdaCallback(on_epoch_end=lambda e, logs, i=i: seen.append((i, e))) for i in range(2))
    _fit(_trainer(), data, gen)
    assert seen == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_a_single_callback_is_wrapped_and_other_values_are_refused(data):
    seen = []
    _fit(_trainer(), data, LambdaCallback(on_epoch_end=lambda e, logs: seen.append(e)))
    assert seen == [0, 1]
    with pytest.raises(TypeError, match=r"callbacks=3: expected an easyfit.callbacks.Callback or a list"):
        _fit(_trainer(), data, 3)


def _crash_with_one_backup(backup_dir, data, epoch, batch):
    """A fit backing up every batch that crashes at ``(epoch, batch)``; its one backup's step."""
    crashing = _trainer()
    with pytest.raises(Crash):
        _fit(crashing, data, [BackupAndRestore(backup_dir, save_freq=1), crash_at(crashing, epoch, batch)])
    (step,) = [n for n in os.listdir(backup_dir / BACKUPS) if n.isdigit()]
    return step


def test_with_every_backup_damaged_fit_refuses_to_start_afresh(tmp_path, data):
    # Keras raises when its backup cannot be loaded; easyfit too, once none is intact
    backup_dir = tmp_path / "run"
    step = _crash_with_one_backup(backup_dir, data, 0, 1)
    metadata = backup_dir / BACKUPS / step / "metadata" / "metadata"
    metadata.write_text(metadata.read_text().replace('"epoch": 0', '"epoch": 1'))
    with (
        pytest.warns(RuntimeWarning, match="is damaged"),
        pytest.raises(ef.CheckpointError, match="no intact backup"),
    ):
        _fit(_trainer(), data, [BackupAndRestore(backup_dir)])
    assert sorted(os.listdir(backup_dir / BACKUPS)) == ["EASYFIT_BACKUPS", f"damaged-{step}"]
    with pytest.raises(ef.CheckpointError, match="no intact backup"):  # again: not afresh by retrying
        _fit(_trainer(), data, [BackupAndRestore(backup_dir)])


def test_model_checkpoint_max_to_keep_deletes_only_its_own_checkpoints(tmp_path, data):
    # an old checkpoint that someone replaced by their own directory is not deleted
    def swap(epoch, logs):
        if epoch == 0:
            shutil.rmtree(tmp_path / "ep1")
            _user_files(tmp_path / "ep1")

    ckpt = ModelCheckpoint(str(tmp_path / "ep{epoch}"), max_to_keep=1)
    _fit(_trainer(), data, [ckpt, LambdaCallback(on_epoch_end=swap)], epochs=2)
    assert (tmp_path / "ep1" / "config.yaml").read_text() == "lr: 0.1\n"
    assert ef.checkpoint.read_metadata(tmp_path / "ep2")["epoch"] == 2


def test_a_backup_of_an_earlier_easyfit_in_backup_dir_itself_is_resumed_then_deleted(tmp_path, data):
    backup_dir = tmp_path / "run"
    step = _crash_with_one_backup(backup_dir, data, 1, 1)
    os.rename(backup_dir / BACKUPS / step, backup_dir / step)  # the layout before easyfit-backups/
    shutil.rmtree(backup_dir / BACKUPS)
    os.makedirs(backup_dir / "7")  # a user's folder named like a step
    point = BackupAndRestore(backup_dir).restore_point()
    assert (point.epoch, point.batch) == (1, 1)
    assert _fit(_trainer(), data, [BackupAndRestore(backup_dir)]).epoch == [1]
    assert sorted(os.listdir(backup_dir)) == ["7"]  # the old backup went, the user's folder stays


def test_a_backup_replaced_by_a_link_stops_the_fit_naming_it_and_its_target_is_kept(tmp_path, data):
    """A step of the backups replaced by a symbolic link mid-fit (moved to another disk, say):
    max_to_keep would delete it; the fit stops with a CheckpointError naming the link, and the
    link and the backup it points to are left whole."""
    backup_dir, moved = tmp_path / "run", tmp_path / "elsewhere"
    root = backup_dir / BACKUPS
    links: list = []

    def relink(epoch, logs):
        if epoch != 1:  # after epoch 0's backup, before epoch 1's
            return
        while not (steps := [n for n in os.listdir(root) if n.isdigit()]) or not complete(
            str(root / steps[0])
        ):
            time.sleep(0.01)  # epoch 0's backup is written asynchronously
        shutil.move(root / steps[0], moved)
        os.symlink(moved, root / steps[0])
        links.append((root / steps[0], sorted(moved.rglob("*"))))

    with pytest.raises(ef.CheckpointError, match=rf"{root}/\d+ is a symbolic link.*leaves both"):
        _fit(_trainer(), data, [LambdaCallback(on_epoch_end=relink), BackupAndRestore(backup_dir)])
    (link, files), *_ = links
    assert os.path.islink(link) and sorted(moved.rglob("*")) == files
    verify(str(link))  # the backup it points to is whole
    assert not os.path.exists(str(backup_dir) + ".lock")
