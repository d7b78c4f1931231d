"""Data parallel over 1, 4 and 8 virtual CPU devices: meshes of that many of one process's 8
(tests/programs/parallel_devices.py), one interpreter for every run."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import last_json, run_program

pytestmark = pytest.mark.slow  # every test here runs programs in fresh interpreters

#: Parameters after 2 epochs (30 steps of SGD with momentum) on 1, 4 and 8 devices, and with 1
#: or 4 steps per dispatch, agree to within float32 reduction order: the gradients are summed
#: over the devices in another order.
RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def runs(mnist_dir, tmp_path_factory):
    """The program's JSON figures of each run, with its trained parameters (leaves in tree order)."""
    out = tmp_path_factory.mktemp("params")
    result = last_json(run_program("parallel_devices.py", mnist_dir, str(out), devices=8))
    assert result.pop("process_devices") == 8
    for name, r in result.items():
        if "error" not in r:
            with np.load(out / f"{name}.npz") as saved:
                r["params"] = [saved[k] for k in sorted(saved.files, key=lambda k: int(k[4:]))]
    return result


@pytest.fixture(scope="module")
def by_devices(runs):
    return {n: runs[str(n)] for n in (1, 4, 8)}


def test_every_device_holds_a_replica_and_accuracy_agrees(by_devices):
    for n, r in by_devices.items():
        assert r["devices"] == n and r["shards_per_leaf"] == n
        assert r["replicas_identical"]
        assert r["predict_rows"] == 500
    accuracies = [r["val_accuracy"] for r in by_devices.values()]
    assert min(accuracies) > 0.85
    assert max(accuracies) - min(accuracies) < 0.03


def test_device_count_does_not_change_the_math(by_devices):
    # Same seed and global batch: the same samples in the same steps, whatever the split.
    reference = by_devices[1]["params"]
    for n in (4, 8):
        for got, want in zip(by_devices[n]["params"], reference, strict=True):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{n} devices")


def test_batch_size_not_divisible_by_the_devices(runs):
    error = runs["8-batch-100"]["error"]
    assert "batch_size=100" in error and "8 devices" in error


def test_steps_per_execution_on_several_devices(runs, by_devices):
    # 4 steps per dispatch (15 steps an epoch: 4, 4, 4, then 3) train the same steps on the same
    # batches as 1 per dispatch: the same parameters, up to the order of float sums.
    r = runs["4-k4"]
    assert r["devices"] == 4 and r["replicas_identical"] and r["val_accuracy"] > 0.85
    for got, want in zip(r["params"], by_devices[4]["params"], strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg="k=4 against k=1")
