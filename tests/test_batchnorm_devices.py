"""Cross-device BatchNorm: the batch statistics are those of the whole global batch, whatever
the number of devices (one jitted step over a sharded batch: XLA reduces the mean and variance
across devices, as Flax's ImageNet example does with ``axis_name`` under pmap). Training on 1
and on 4 devices (meshes of one process's 4) gives the same parameters and running statistics,
elementwise."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import run_program

pytestmark = pytest.mark.slow  # every test here runs programs in fresh interpreters


def test_batch_statistics_are_global_on_four_devices(tmp_path):
    proc = run_program("batchnorm_devices.py", str(tmp_path / "run"), devices=4)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == ["1", "4"]  # the devices each fit's state lives on
    got = {}
    for n in (1, 4):
        with np.load(tmp_path / f"run-{n}.npz") as f:
            got[n] = {k: f[k] for k in f.files}
    assert got[1].keys() == got[4].keys()
    assert any("batch_stats" in k for k in got[1])
    for key in got[1]:
        # float32 sums split over 4 devices add in another order: a few ulps after 10 steps
        np.testing.assert_allclose(got[4][key], got[1][key], rtol=2e-4, atol=2e-5, err_msg=key)
