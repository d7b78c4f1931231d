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


def test_parquet_vs_folder_writes_the_same_jpegs_and_trains_alike_on_each(tmp_path):
    import pyarrow.parquet as pq

    root = tmp_path / "bench"
    out = run(
        "parquet_vs_folder.py",
        str(root),
        *("--images", "80", "--sides", "40,80", "--epochs", "2", "--batch-size", "16"),
        *("--model", "tiny", "--image-size", "32", "--shards", "2", "--row-group", "16"),
        *("--repeat", "1", "--out", str(tmp_path / "r.json")),
        *("--small-cache-shuffle", "global"),  # the folder's order: the same training
    )
    shards = sorted(os.listdir(root / "parquet" / "data"))
    assert shards == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    rows = [row for s in shards for row in pq.read_table(root / "parquet" / "data" / s).to_pylist()]
    train = root / "folder" / "train"
    files = [
        (train / c / f, k)
        for k, c in enumerate(sorted(os.listdir(train)))
        for f in sorted(os.listdir(train / c))
    ]
    assert len(rows) == len(files) == 70
    for row, (path, label) in zip(rows, files, strict=True):
        assert row["image"]["bytes"] == path.read_bytes() and row["label"] == label
    r = json.loads((tmp_path / "r.json").read_text())
    (folder,), (parquet,) = r["tiny"]["folder"], r["tiny"]["parquet"]
    small = r["shard_bytes"] // 4
    ((label, (quarter,)),) = [(k, v) for k, v in r["tiny"].items() if k.startswith("parquet, cache_bytes")]
    assert label == f"parquet, cache_bytes {small / 2**20:,.1f} MiB"
    assert folder["images"] == parquet["images"] == quarter["images"] == 70
    assert folder["images_per_s"] > 0 and parquet["images_per_s"] > 0
    assert parquet["row_group_reads_per_pass"] <= 1.0  # all cached: each read once in the run
    assert quarter["row_group_reads_per_pass"] > 1.0  # shuffle="global": read again and again
    # the same images in the same order (the plan's), the same crops: the same training, also
    # with a cache of a quarter of the shards (row groups read ahead, dropped and read again)
    for run_ in (parquet, quarter):
        assert run_["accuracy"] == folder["accuracy"]
        np.testing.assert_allclose(run_["loss"], folder["loss"], rtol=1e-5)
    table = {row["source"]: row for row in r["table"]}
    assert table["parquet"]["speed_vs_folder"] == parquet["images_per_s"] / folder["images_per_s"]
    assert f"| tiny | parquet | 1 | {parquet['images_per_s']:,.0f} |" in out
    assert r["machine"]["cores"] >= 1 and r["command"].startswith("python ")


def test_startup_timeline_records_the_start_up_functions_until_the_first_step(tmp_path):
    import easyfit as ef

    root = ef.datasets.sample_folder(str(tmp_path / "mnist"), limit=(60, 20))
    out = tmp_path / "timeline.txt"
    run("startup_timeline.py", str(out), root, "--batch-size", "20", "--classes", "10", "--child", "easyfit")
    rows = [line.split(None, 4) for line in out.read_text().splitlines()]
    names = {r[4].strip() for r in rows}
    # every function it wraps still exists and ran (a rename in easyfit would leave it silent)
    for name in ("DataInputs.fit_data", "DataInputs.train_loader", "FedPipelines.__init__"):
        assert name in names, name
    assert {"StateMaker.abstract", "StateMaker.make", "Trainer._init_state", "first step"} <= names
    assert any(n.startswith("jax ") for n in names)  # JAX's compilation events
    for start, end, seconds, *_ in rows:
        assert 0 <= float(start) <= float(end) and abs(float(end) - float(start) - float(seconds)) < 2e-3


def test_pipeline_build_times_each_set_up_of_the_recipes_pipelines(tmp_path):
    import easyfit as ef

    root = ef.datasets.synthetic_images(
        tmp_path / "photos", classes=2, per_class=(16, 2), size=(40, 90), workers=1
    )
    out = tmp_path / "rows.json"
    run("pipeline_build.py", root, "--image-size", "32", "--batch-size", "16", "--json", str(out))
    rows = json.loads(out.read_text())
    assert [r["setup"] for r in rows] == ["plain", "runtime_first", "trivial_first", "hw_decoder_off"]
    for r in rows:
        # one build per pipeline (and the copy pipeline first), each with its lock measure
        assert len(r["builds_s"]) == len(r["lock_held_s"]) == (2 if r["setup"] == "trivial_first" else 1)
        assert all(0 <= h <= b + 0.06 for h, b in zip(r["lock_held_s"], r["builds_s"], strict=True))
        assert r["first_chunk_s"] > 0


def test_pipeline_build_times_three_builds_of_each_graph_of_the_crop(tmp_path):
    out = tmp_path / "graphs.json"
    run("pipeline_build.py", "--graphs", "--json", str(out))
    rows = json.loads(out.read_text())
    assert [r["graph"] for r in rows] == ["peek_and_slice", "decode_and_slice", "decode", "peek"]
    assert all(len(r["builds_s"]) == 3 and min(r["builds_s"]) >= 0 for r in rows)


def test_epoch_checks_times_both_epochs_with_the_cpu_of_the_process_and_its_checkers(tmp_path):
    out = tmp_path / "runs.json"
    args = ("--files", "200", "--classes", "4", "--size", "8", "--batch-size", "20", "--repeat", "1")
    printed = run("epoch_checks.py", str(tmp_path / "data"), *args, "--children", "1", "--json", str(out))
    (epochs,) = json.loads(out.read_text())
    assert [e["epoch"] for e in epochs] == [1, 2]
    for e in epochs:
        assert 0 < e["after_first_step"] <= e["seconds"] and 0 <= e["input_wait"] <= 1
        assert 0 < e["feed"] and 0 < e["cpu_process"] and 0 <= e["cpu_children"] and 0 < e["busy_cores"]
    assert "| CPU s, this process | CPU s, checker children | busy cores (machine) |" in printed
