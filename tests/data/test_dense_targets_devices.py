"""Segmentation folders and CSV regression on 1 and 4 virtual CPU devices (issue 15): meshes of
one process's 4."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import last_json, run_program
from tests.helpers.dense import write_image_csv, write_segmentation

pytestmark = pytest.mark.slow  # runs programs in fresh interpreters

#: As in tests/test_parallel.py: the gradients are summed over the devices in another order.
RTOL, ATOL = 1e-4, 1e-5


def test_the_device_count_does_not_change_training_on_dense_targets(tmp_path):
    write_segmentation(tmp_path / "seg" / "train", 24, seed=0)
    write_segmentation(tmp_path / "seg" / "val", 10, seed=1)
    write_image_csv(tmp_path / "csv" / "train", 20, seed=0, name="train.csv")
    write_image_csv(tmp_path / "csv" / "val", 10, seed=1, name="val.csv")
    printed = last_json(
        run_program("dense_targets_devices.py", str(tmp_path), str(tmp_path / "run"), devices=4)
    )
    runs = {}
    for n in (1, 4):
        figures = printed[str(n)]
        assert figures["devices"] == n and figures["seg_shards"] == n
        with np.load(tmp_path / f"run-{n}.npz") as saved:
            runs[n] = figures, {k: saved[k] for k in saved.files}
    (one, a), (four, b) = runs[1], runs[4]
    assert a["seg_outputs"].shape == (10, 16, 16, 3) and a["csv_outputs"].shape == (10, 2)
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=RTOL, atol=ATOL, err_msg=key)
    for key in ("seg_val_loss", "csv_val_loss"):
        np.testing.assert_allclose(four[key], one[key], rtol=RTOL, err_msg=key)
