"""The easyfit command: `demo` trains offline and draws its curves; `info` reports and warns."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from importlib import metadata

import pytest

from easyfit._info import Environment, collect, problems, report
from easyfit.cli import main
from tests.helpers import ROOT, run_python
from tests.helpers.formats import break_three, write_folder


def easyfit_command(*args: str, cwd, devices: int = 1) -> str:
    return run_python("-m", "easyfit.cli", *args, cwd=cwd, devices=devices)


@pytest.mark.slow
def test_demo_trains_on_the_packaged_sample_and_draws_the_curves(tmp_path):
    from matplotlib.image import imread

    out = easyfit_command("demo", "--out", "figures", cwd=tmp_path)  # default: 5 epochs
    assert "batch 200, 5 epochs, on 1 cpu device" in out
    epochs = re.findall(r"^Epoch (\d+)/5 .* val_accuracy: ([\d.]+)$", out, re.M)
    assert [int(e) for e, _ in epochs] == [1, 2, 3, 4, 5]
    accuracy = float(re.search(r"^validation accuracy: ([\d.]+)", out, re.M).group(1))
    assert accuracy >= 0.90 and accuracy == pytest.approx(float(epochs[-1][1]), abs=1e-4)
    assert imread(tmp_path / "figures" / "learning_curves.png").shape[1] >= 800


def test_demo_refuses_a_bad_epoch_count(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--epochs", "0"])
    assert exit_.value.code == 2 and "--epochs 0: must be at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_info_prints_versions_backend_and_devices(tmp_path):
    out = easyfit_command("info", cwd=tmp_path, devices=2)
    import nvidia.dali

    import easyfit

    fields = dict(re.findall(r"^(\S+)\s+(.*)$", out, re.M))
    assert fields["easyfit"] == easyfit.__version__
    assert fields["jax"].startswith(metadata.version("jax") + " ")
    assert fields["flax"] == metadata.version("flax")
    assert fields["optax"] == metadata.version("optax")
    assert fields["dali"].startswith(nvidia.dali.__version__ + " ")
    assert fields["backend"] == "cpu" and fields["devices"] == "2 x cpu"
    assert (
        fields["sharding"]
        == "replicated by default; Trainer(sharding='zero1' or 'fsdp') splits arrays over 4 MiB 2 ways"
    )
    assert "--xla_gpu_enable_command_buffer=" in fields["XLA_FLAGS"]
    assert fields["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"


def test_collect_reads_this_environment():
    import jax

    env = collect()
    assert env.versions["jax"] == jax.__version__ and env.backend == jax.default_backend()
    assert len(env.devices) == jax.device_count()


GOOD = Environment(
    python="3.11.9",
    versions={"jax": "0.6.0", "flax": "0.10.4", "nvidia-dali": "2.4.0", "matplotlib": None},
    requirements=(
        "jax>=0.4.30",
        "flax>=0.10",
        "nvidia-dali-cuda120>=1.40",
        'matplotlib>=3.6; extra == "plot"',
    ),
    requires_python=">=3.10",
    backend="gpu",
    dali_cuda=12,
    jax_cuda=12,
    xla_flags="--xla_gpu_enable_command_buffer= --xla_dump_to=/tmp/x",
    gpu_present=True,
)


def test_info_says_whether_s3_paths_can_be_read():
    with_boto3 = dataclasses.replace(
        GOOD, versions={**GOOD.versions, "boto3": "1.44.8"}, s3_endpoint="http://127.0.0.1:9000"
    )
    fields = dict(re.findall(r"^(\S+)\s+(.*)$", report(with_boto3), re.M))
    assert fields["s3://"] == "available (boto3 1.44.8; endpoint http://127.0.0.1:9000)"
    fields = dict(re.findall(r"^(\S+)\s+(.*)$", report(GOOD), re.M))
    assert fields["s3://"] == "not available: boto3 is not installed (pip install 'easyfit-flax[s3]')"


def test_a_good_environment_has_no_problems():
    assert problems(GOOD) == []


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"xla_flags": ""}, "without --xla_gpu_enable_command_buffer= in XLA_FLAGS"),
        ({"xla_flags": "--xla_gpu_enable_command_buffer=FUSION"}, "command buffers"),
        ({"versions": {**GOOD.versions, "nvidia-dali": None}}, "DALI is not installed"),
        ({"jax_cuda": 13}, "DALI was built for CUDA 12 but JAX's CUDA plugin is for CUDA 13"),
        ({"python": "3.9.18"}, "Python 3.9.18 is too old: easyfit needs Python>=3.10"),
        ({"versions": {**GOOD.versions, "jax": "0.4.20"}}, "jax 0.4.20 is too old"),
        ({"versions": {**GOOD.versions, "nvidia-dali": "1.30.0"}}, "nvidia-dali-cuda120 1.30.0"),
        ({"versions": {**GOOD.versions, "flax": None}}, "flax is not installed"),
        ({"backend": "cpu"}, "has an NVIDIA GPU but JAX runs on the CPU"),
        ({"backend": "failed: no CUDA driver"}, "could not start its backend (no CUDA driver)"),
        ({"other_easyfit": "0.0.21"}, "the distribution easyfit 0.0.21 is installed too"),
    ],
)
def test_each_known_bad_combination_is_reported(change, expected):
    import dataclasses

    found = problems(dataclasses.replace(GOOD, **change))
    assert len(found) == 1 and expected in found[0], found


def test_console_script_is_declared():
    try:
        scripts = metadata.entry_points(group="console_scripts")
    except metadata.PackageNotFoundError:  # pragma: no cover
        pytest.skip("easyfit is not installed")
    assert {e.name: e.value for e in scripts}.get("easyfit") == "easyfit.cli:main"


@pytest.mark.slow
def test_easyfit_check_prints_every_bad_file_and_exits_non_zero(tmp_path):
    paths = write_folder(tmp_path / "data" / "train")
    write_folder(tmp_path / "data" / "val")
    expected = break_three(paths)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "easyfit.cli", "check", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[1:4] == expected
    assert (
        lines[0].startswith(f"checked ImageFolder('{tmp_path / 'data' / 'train'}'")
        and "3 problems" in lines[0]
    )
    assert (
        lines[4].startswith(f"checked ImageFolder('{tmp_path / 'data' / 'val'}'")
        and "no problems" in lines[4]
    )
    assert lines[5].startswith(
        f"3 bad files or records in {tmp_path / 'data'}. Remove or replace these files"
    )
    assert "is_valid_file=" in lines[5] and len(lines) == 6


def test_easyfit_check_of_good_data_exits_0_and_of_no_data_1(tmp_path, capsys):
    write_folder(tmp_path / "d")
    assert main(["check", str(tmp_path / "d"), "--workers", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"checked ImageFolder('{tmp_path / 'd'}': 6 images, 2 classes)")
    assert lines[1] == f"{tmp_path / 'd'}: every file and record passed fit's checks" and len(lines) == 2
    assert main(["check", str(tmp_path / "none")]) == 1  # not data at all: said, and why
    assert capsys.readouterr().out.splitlines() == [
        f"{tmp_path / 'none'}: no such directory",
        f"{tmp_path / 'none'}: not data fit can read; fix what is said above, then check again",
    ]
