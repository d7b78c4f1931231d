"""easyfit.data.check_pool: a streamed source's host checks, run in checker child processes
(ahead of the feed), and in this process where no child runs."""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import threading
import time

import numpy as np
import pytest

import easyfit as ef
from easyfit.data import check_pool
from easyfit.data.check_pool import CheckPool
from easyfit.data.sources.folder import path_table
from easyfit.data.validation import encoded
from easyfit.data.validation.samples import checked_sample, sample_stamp
from tests.helpers.internals import checker_pool


def _checkers() -> list[int]:
    """The pids of this process's checker children (from /proc)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"_easyfit_validation" in cmdline:
            found.append(int(pid))
    return found


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _jpeg(seed: int, side: int = 16) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG")
    return buf.getvalue()


def _folder(root, n: int = 40) -> list[str]:
    """``root/<a|b>/<i>.jpg``: n small JPEGs; their paths in ImageFolder order."""
    for i in range(n):
        os.makedirs(os.path.join(root, "ab"[i % 2]), exist_ok=True)
        with open(os.path.join(root, "ab"[i % 2], f"{i:03d}.jpg"), "wb") as f:
            f.write(_jpeg(i))
    return ef.data.ImageFolder(root).files


def _damage(kind: str, good: bytes) -> bytes:
    if kind == "empty":
        return b""
    if kind == "truncated":
        return good[: len(good) // 2]
    i = 2  # "quantization table": its segment length points past the file's end
    while good[i + 1] != 0xDB:
        i += 2 + int.from_bytes(good[i + 2 : i + 4], "big")
    return good[: i + 2] + b"\xf0\x00" + good[i + 4 :]


@pytest.mark.parametrize("kind", ["empty", "truncated", "quantization table"])
def test_a_damaged_jpeg_in_a_streamed_folder_is_named_by_a_checker_child(tmp_path, trainer, kind):
    files = _folder(tmp_path)
    source = ef.data.ImageFolder(tmp_path)  # (its images sampled for their shape, whole)
    with open(files[33], "rb") as f:
        good = f.read()
    with open(files[33], "wb") as f:
        f.write(_damage(kind, good))
    source.sample_problem = lambda index: None  # this process's check off: only a child's can name it
    with pytest.raises(ef.errors.DataError, match=f"^{files[33]}: "):
        trainer.fit(source, epochs=1, batch_size=8, cache=False, verbose=0)
    pool = checker_pool(source)
    assert pool is not None and pool.children >= 1
    source.close()


def _pool(files, children=None) -> CheckPool:
    return CheckPool([path_table(files)], "image", children)


def _in_order(files) -> np.ndarray:
    return np.arange(len(files))


@pytest.mark.parametrize("children", [None, 0], ids=["children", "this process"])
def test_a_file_replaced_after_its_check_is_checked_again(tmp_path, children):
    files = _folder(tmp_path, 8)
    here = ef.data.ImageFolder(tmp_path).sample_problem
    pool = _pool(files, children)
    try:
        assert (pool.children == 0) == (children == 0)
        assert pool.problem(_in_order(files), here) is None
        with open(files[5], "wb") as f:
            f.write(_damage("truncated", _jpeg(5)))
        found = pool.problem(np.array([7, 5, 1]), here)
        assert found is not None and found[0] == 5 and "truncated" in found[1]
    finally:
        pool.close()


def test_a_file_replaced_between_its_check_ahead_and_a_later_feed_is_checked_again(tmp_path, monkeypatch):
    monkeypatch.setattr(check_pool, "FRESH_SECONDS", 0.0)  # every check ahead is too old to stand
    files = _folder(tmp_path, 8)
    pool = _pool(files)
    try:
        assert pool.children >= 1
        pool.ahead(_in_order(files))  # checked in the children, the file still whole
        pool._collect_ahead(_in_order(files), {})
        with open(files[2], "wb") as f:
            f.write(b"")
        found = pool.problem(_in_order(files), lambda index: None)
        assert found == (2, "empty file")
    finally:
        pool.close()


def test_a_fresh_check_ahead_stands_for_the_feeds_stat_and_the_next_feed_stats(tmp_path, monkeypatch):
    # the feed of a sample checked ahead moments before takes that check's stamp (no stat
    # queued behind the latest checks ahead); the next feed stats it, and finds the change
    monkeypatch.setattr(check_pool, "FRESH_SECONDS", 60.0)
    files = _folder(tmp_path, 8)
    pool = _pool(files)
    try:
        pool.ahead(_in_order(files))
        pool._collect_ahead(_in_order(files), {})  # the children have read the files
        with open(files[2], "wb") as f:
            f.write(b"")
        assert pool.problem(_in_order(files), lambda index: None) is None
        assert pool.problem(_in_order(files), lambda index: None) == (2, "empty file")
    finally:
        pool.close()


def test_a_feed_does_not_wait_for_the_checks_sent_ahead_after_its_own(tmp_path, monkeypatch):
    # the second batch sent ahead holds a FIFO, whose check blocks in the child until a writer
    # opens it: the first batch's feed reads its own answers, before that one, and returns
    monkeypatch.setattr(check_pool, "FRESH_SECONDS", 60.0)
    files = _folder(tmp_path, 8)
    fifo = str(tmp_path / "fifo.jpg")
    os.mkfifo(fifo)
    pool = CheckPool([path_table([*files, fifo])], "image", 1)
    result: list[object] = []
    feed = threading.Thread(target=lambda: result.append(pool.problem(np.arange(4), lambda i: None)))
    try:
        pool.ahead(np.arange(4))
        pool.ahead(np.arange(4, 9))
        feed.start()
        feed.join(timeout=30)
        assert not feed.is_alive() and result == [None]
    finally:
        _open_for_its_reader(fifo)  # the child waits on the FIFO: let it go on
        if feed.ident is not None:
            feed.join(timeout=60)
        pool.close()


def _open_for_its_reader(fifo: str, seconds: float = 60) -> None:
    """Opens and closes ``fifo`` for writing once a reader has it open (its open returns)."""
    end = time.monotonic() + seconds
    while True:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            return
        except OSError:  # no reader yet
            if time.monotonic() > end:
                raise
            time.sleep(0.02)


def test_the_checks_sent_ahead_are_spread_over_every_child(tmp_path):
    # the next feed waits for the latest checks sent ahead (its stats queue behind them), so
    # even a few samples go to all children at once; a feed's own requests keep 32 a child
    files = _folder(tmp_path, 8)
    pool = _pool(files, 4)
    try:
        pool.ahead(np.arange(8))
        assert sorted(len(sent) for child in pool._children for sent, _ in child.pending) == [2, 2, 2, 2]
        assert pool.problem(np.arange(8), lambda index: None) is None
    finally:
        pool.close()


def test_the_children_check_against_this_process_max_image_pixels(tmp_path, monkeypatch):
    files = _folder(tmp_path, 4)  # 16x16 images
    pool = _pool(files)
    try:
        monkeypatch.setattr(encoded, "MAX_IMAGE_PIXELS", 100)
        found = pool.problem(np.array([3]), lambda index: None)
        assert found is not None and found[0] == 3 and "more than MAX_IMAGE_PIXELS (100" in found[1]
    finally:
        pool.close()


def test_where_no_child_can_start_the_checks_run_in_this_process(tmp_path, monkeypatch):
    files = _folder(tmp_path, 6)
    check = ef.data.ImageFolder(tmp_path).sample_problem
    with open(files[4], "wb") as f:
        f.write(b"")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    pool = _pool(files, 2)
    asked = []

    def here(index: int) -> str | None:
        asked.append(index)
        return check(index)

    assert pool.problem(_in_order(files), here) == (4, "empty file")
    assert pool.children == 0 and sorted(asked) == list(range(6))


def test_the_number_of_checkers_is_set_by_easyfit_checkers(tmp_path, monkeypatch):
    files = _folder(tmp_path, 4)
    monkeypatch.setenv("EASYFIT_CHECKERS", "0")  # checks in this process: no child starts
    others = set(_checkers())
    pool = _pool(files)
    try:
        assert pool.problem(_in_order(files), ef.data.ImageFolder(tmp_path).sample_problem) is None
        assert pool.children == 0 and set(_checkers()) == others
    finally:
        pool.close()
    monkeypatch.setenv("EASYFIT_CHECKERS", " 3 ")
    assert check_pool.default_children() == 3
    for bad in ("-1", "two", "1.5"):
        monkeypatch.setenv("EASYFIT_CHECKERS", bad)
        with pytest.raises(ValueError, match=f"^EASYFIT_CHECKERS='{re.escape(bad)}': expected the number"):
            check_pool.default_children()


def test_a_child_that_dies_leaves_the_checks_to_this_process(tmp_path):
    files = _folder(tmp_path, 6)
    here = ef.data.ImageFolder(tmp_path).sample_problem
    others = set(_checkers())  # of pools other tests of this process left to the collector
    pool = _pool(files, 1)
    try:
        (pid,) = set(_checkers()) - others
        os.kill(pid, signal.SIGKILL)
        while _state(pid) != "Z":  # dead, not yet waited for
            time.sleep(0.01)
        with open(files[1], "wb") as f:
            f.write(b"")
        assert pool.problem(_in_order(files), here) == (1, "empty file")
        assert pool.children == 0
    finally:
        pool.close()


def test_a_rewritten_or_removed_file_changes_its_stamp_and_no_other(tmp_path):
    paths = [str(tmp_path / f"{i}.bin") for i in range(3)]
    for i, p in enumerate(paths):
        with open(p, "wb") as f:
            f.write(b"x" * (i + 1))
    before = [sample_stamp([p]) for p in paths]
    assert 0 not in before and len(set(before)) == 3
    with open(paths[1], "r+b") as f:  # rewritten in place: same size and inode
        f.write(b"y")
    os.utime(paths[1], ns=(1, 1))  # even with its modification time set back
    os.remove(paths[2])
    after = [sample_stamp([p]) for p in paths]
    assert after[0] == before[0] and after[1] != before[1] and after[2] == 0
    assert sample_stamp(paths[:2]) not in (0, after[0], after[1]) and sample_stamp(paths) == 0


def test_a_sample_checked_ahead_keeps_the_stamp_its_stat_gives(tmp_path):
    # a child stamps a sample it checks the first time from the file its check opened: the
    # stamp must be what os.stat gives, or every later feed would check the sample again
    files = _folder(tmp_path, 8)
    pool = _pool(files, 2)
    try:
        pool.ahead(_in_order(files))
        pool._collect_ahead(_in_order(files), {})  # the answers to the checks ahead, as a feed reads them
        assert pool._stamps.tolist() == [sample_stamp([p]) for p in files]
    finally:
        pool.close()


def test_a_checked_sample_is_stamped_as_sample_stamp_stamps_it(tmp_path):
    from PIL import Image

    image, mask, empty = (str(tmp_path / name) for name in ("a.jpg", "a.png", "b.jpg"))
    (tmp_path / "a.jpg").write_bytes(_jpeg(0))
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(mask)
    (tmp_path / "b.jpg").write_bytes(b"")
    assert checked_sample("image", [image]) == (sample_stamp([image]), None)
    assert checked_sample("file", [image]) == (sample_stamp([image]), None)
    assert checked_sample("segmentation", [image, mask]) == (sample_stamp([image, mask]), None)
    assert checked_sample("image", [empty]) == (0, "empty file")
    assert checked_sample("image", [str(tmp_path / "gone.jpg")])[0] == 0


def test_the_children_end_when_the_trainer_is_closed(tmp_path, mnist_dir):
    from tests.helpers.models import SmallMLP

    before = set(_checkers())
    with ef.Trainer(SmallMLP(), seed=0) as trainer:
        trainer.fit(mnist_dir + "/val", epochs=1, batch_size=100, cache=False, verbose=0)
        assert set(_checkers()) - before  # the folder's checks ran in children
    assert not set(_checkers()) - before  # none of them is left (others may have ended)


def test_a_subclass_that_overrides_sample_problem_has_its_own_check_run(tmp_path):
    files = _folder(tmp_path, 8)

    class Picky(ef.data.ImageFolder):
        def sample_problem(self, index):
            return "not wanted" if index == 3 else super().sample_problem(index)

    source = Picky(tmp_path)
    try:
        source.feed(np.array([0, 1, 2]))
        with pytest.raises(
            ef.errors.DataError,
            match=f"^{files[3]}: not wanted \\(to list every bad file at once: easyfit check ",
        ):
            source.feed(np.array([4, 3]))
    finally:
        source.close()


def test_every_batch_after_the_first_is_told_to_its_source_before_its_feed(tmp_path, trainer):
    _folder(tmp_path, 40)
    events = []

    class Recording(ef.data.ImageFolder):
        def prepare(self, indices):
            events.append(("prepare", set(indices.tolist())))
            super().prepare(indices)

        def feed(self, indices):
            events.append(("feed", set(indices.tolist())))
            return super().feed(indices)

    source = Recording(tmp_path)
    try:
        trainer.fit(source, epochs=2, batch_size=8, cache=False, verbose=0)
    finally:
        source.close()
    feeds = [i for i, (kind, _) in enumerate(events) if kind == "feed"]
    assert len(feeds) >= 10
    for f in feeds[1:]:
        told = set().union(*(s for kind, s in events[:f] if kind == "prepare"))
        assert events[f][1] <= told


def test_a_problem_found_ahead_is_raised_by_the_feed(tmp_path):
    files = _folder(tmp_path, 8)
    with open(files[6], "wb") as f:
        f.write(_damage("truncated", _jpeg(6)))
    pool = _pool(files)
    try:
        pool.ahead(_in_order(files))
        found = pool.problem(np.array([5, 6, 7]), lambda index: None)
        assert found is not None and found[0] == 6 and "truncated" in found[1]
    finally:
        pool.close()
