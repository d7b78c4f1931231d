"""The benchmarks' LMDB mode runs end to end on a small LMDB, so that it cannot rot unseen."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest

from tests.helpers import ROOT, run_python
from tests.helpers.formats import INT32, STRING, caffe2_messages

pytestmark = pytest.mark.slow  # runs the benchmark scripts in fresh interpreters

BENCHMARKS = ROOT / "benchmarks"


def run(script: str, *args: str) -> str:
    return run_python(str(BENCHMARKS / script), *args)


def test_make_data_lmdb_then_bench_with_the_hand_written_lmdb_loop(tmp_path, mnist_idx):
    import lmdb
    from PIL import Image

    import easyfit as ef

    root = tmp_path / "mnist_lmdb"
    run("make_data.py", str(root), "--format", "lmdb", "--source", mnist_idx, "--limit", "1000,200")
    x, y = ef.datasets.mnist_arrays(mnist_idx)["train"]
    with lmdb.open(str(root / "train"), readonly=True, lock=False) as env, env.begin() as txn:
        assert env.stat()["entries"] == 1000
        keys = [k for k, _ in txn.cursor()]
        record = caffe2_messages()["TensorProtos"].FromString(txn.get(keys[-1]))
    image, label = record.protos
    assert keys[-1] == b"00000999"  # MNIST's order
    assert (image.data_type, label.data_type, list(label.int32_data)) == (STRING, INT32, [y[999]])
    decoded = Image.open(io.BytesIO(image.string_data[0]))
    assert decoded.format == "JPEG"
    assert np.abs(np.asarray(decoded, np.float32) - x[999, :, :, 0]).mean() < 3  # quality 95

    out = run(
        "bench.py",
        str(root),
        "--reference",
        str(BENCHMARKS / "lmdb_loop.py"),
        "--epochs",
        "1",
        "--modes",
        "cache",
        "--json",
        str(tmp_path / "rows.json"),
    )
    assert "1000 training samples (Caffe2 LMDB)" in out
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["label"] for r in rows] == ["hand-written reference loop (lmdb_loop.py)", "easyfit fit, cache"]
    for r in rows:
        assert r["steady_samples_per_s"] > 0
        assert 0 < r["first_epoch_s"] <= r["setup_first_epoch_s"] <= r["total_s"]
        assert r["val_accuracy"] > 0.3  # 5 steps on the right labels; chance is 0.1
        assert f"| {r['label']} | {r['steady_samples_per_s']:,} | {r['first_epoch_s']:.2f} |" in out


def test_startup_times_the_loop_and_easyfit_cold_then_warm(tmp_path):
    out = run(
        "startup.py",
        str(tmp_path / "data"),
        "--files",
        "200",
        "--classes",
        "4",
        "--size",
        "8",
        "--batch-size",
        "20",
        "--json",
        str(tmp_path / "rows.json"),
    )
    train = tmp_path / "data" / "train"
    assert sorted(os.listdir(train)) == [f"n{c:08d}" for c in range(4)]
    assert sum(len(os.listdir(train / c)) for c in os.listdir(train)) == 200
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["label"] for r in rows] == [
        "hand-written DALI + Flax loop",
        "easyfit, cold (empty compilation cache)",
        "easyfit, warm (second run)",
    ]
    for r in rows:
        assert r["first_step_s"] > 0 and r["rss_mib"] > 50  # an interpreter with JAX and DALI
        assert f"| {r['label']} | {r['first_step_s']:.2f} | {r['rss_mib']:,.0f} |" in out
    assert rows[1]["cache_hits"] == 0 and rows[2]["cache_hits"] > 0  # the warm run reads the cache
