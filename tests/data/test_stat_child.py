"""easyfit.data.stat_child: the file states a streamed folder compares batch by batch, stat'ed
in a child process (and in this one once the child is gone)."""

from __future__ import annotations

import os

import numpy as np

from easyfit.data.stat_child import StatChild


def _files(tmp_path, n=5):
    paths = []
    for i in range(n):
        p = tmp_path / f"{i}.bin"
        p.write_bytes(b"x" * (i + 1))
        paths.append(str(p))
    return paths


def test_a_rewritten_or_removed_file_changes_its_stamp_and_no_other(tmp_path):
    paths = _files(tmp_path)
    child = StatChild(paths)
    try:
        before = child.stamps(np.arange(5))
        assert (before != 0).all() and len(set(before.tolist())) == 5
        with open(paths[1], "r+b") as f:  # rewritten in place: same size and inode
            f.write(b"y")
        os.utime(paths[1], ns=(1, 1))  # even with its modification time set back
        os.remove(paths[3])
        after = child.stamps(np.array([4, 3, 1, 0]))
        assert after[1] == 0  # removed: cannot be stat'ed
        assert after[2] != before[1]  # rewritten
        assert after[0] == before[4] and after[3] == before[0]  # the others unchanged
    finally:
        child.close()


def test_the_stamps_are_the_same_once_the_child_is_gone(tmp_path):
    paths = _files(tmp_path)
    child = StatChild(paths)
    from_child = child.stamps(np.arange(5))
    child.close()  # later requests stat in this process, with the same numbers
    np.testing.assert_array_equal(child.stamps(np.arange(5)), from_child)
