"""The formats on 1 and 4 virtual CPU devices: meshes of one process's 4."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import last_json, run_program

pytestmark = pytest.mark.slow  # every test here runs programs in fresh interpreters

#: The same batches on 1 and 4 devices give the same parameters up to the order of float sums
#: (the gradients are summed over the devices in another order).
RTOL, ATOL = 1e-4, 1e-5


def _params(path):
    with np.load(path) as saved:
        return [saved[k] for k in sorted(saved.files, key=lambda k: int(k[4:]))]


@pytest.fixture(scope="module")
def by_devices(format_roots, mnist_idx, tmp_path_factory):
    out = tmp_path_factory.mktemp("devices")
    args = (mnist_idx, format_roots["lmdb"], format_roots["recordio"], str(out))
    printed = last_json(run_program("formats_devices.py", *args, devices=4))
    results = {}
    for n in (1, 4):
        results[n] = printed[str(n)]
        assert results[n]["devices"] == n
        results[n]["params"] = _params(out / f"params-{n}.npz")
        results[n]["cached_params"] = _params(out / f"cached_params-{n}.npz")
    return results


def _same_params(one, four, what):
    for got, want in zip(four, one, strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


def test_validation_split_and_index_driven_training_do_not_depend_on_devices(by_devices):
    one, four = by_devices[1], by_devices[4]
    assert four["devices"] == 4
    assert abs(one["val_loss"] - four["val_loss"]) < 1e-3  # the same held-out samples
    assert abs(one["val_accuracy"] - four["val_accuracy"]) < 0.02
    _same_params(one["params"], four["params"], "RecordIO fit on 4 devices against 1")


def test_reader_driven_evaluation_sees_every_record_once(by_devices):
    for r in by_devices.values():
        assert r["lmdb_predict_rows"] == 300
        assert r["lmdb_rows_match_arrays"]
        assert r["lmdb_eval"]["accuracy"] == pytest.approx(r["arrays_eval"]["accuracy"], abs=1e-6)
        assert r["lmdb_eval"]["loss"] == pytest.approx(r["arrays_eval"]["loss"], rel=1e-5)
        assert r["reader_epochs_exact"] == [True, True, True]
        assert r["lmdb_fit_val_accuracy"] > 0.7


def test_the_device_cache_of_a_reader_source_does_not_depend_on_devices(by_devices):
    """Read once by one reader per device, through their padding: each epoch exactly the plan's
    samples; a cached fit resumed mid-epoch ends bit for bit as one never stopped; the same
    batches on 1 and 4 devices, so the same parameters up to the order of float sums."""
    for r in by_devices.values():
        # 300 records in chunks of 2 steps of 56: 3 chunks an epoch (each shard padded), 3 epochs
        assert r["reader_chunks_per_epoch"] == 3
        assert r["reader_cache_exact"] == [True] * 9
        assert r["cached_resumed_at"] == [1, 5, {"chunk": 11 + 5, "cached": True}]  # mid-epoch
        assert r["cached_resume_exact"]
        assert r["cached_accuracy"] > 0.7
    _same_params(by_devices[1]["cached_params"], by_devices[4]["cached_params"], "cached fit")
