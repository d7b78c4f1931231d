"""``Trainer(deterministic=True)``: XLA's deterministic-ops flag gets into XLA_FLAGS before the
backend starts, a warning when it is too late, and CPU runs repeat bit for bit either way."""

import os
import warnings

import numpy as np
import pytest

import easyfit as ef
from easyfit._env import DETERMINISTIC_FLAG
from tests.helpers import last_json, run_program
from tests.helpers.models import SmallMLP


@pytest.fixture(scope="module")
def two_runs_each_way(tmp_path_factory) -> dict:
    """``{flag: (printed JSON, npz of two runs' variables)}`` from deterministic_fit.py, run in a
    fresh interpreter with 2 CPU devices for ``deterministic=True`` and for ``False``."""
    tmp = tmp_path_factory.mktemp("deterministic")
    got = {}
    for flag in ("true", "false"):
        out = tmp / f"{flag}.npz"
        printed = last_json(
            run_program("deterministic_fit.py", str(tmp / "mnist"), str(out), flag, devices=2)
        )
        got[flag] = (printed, np.load(out))
    return got


@pytest.mark.slow
def test_the_flag_gets_into_xla_flags_before_the_backend_starts(two_runs_each_way):
    printed, _ = two_runs_each_way["true"]
    flags = printed["xla_flags"].split()
    assert DETERMINISTIC_FLAG in flags
    assert "--xla_force_host_platform_device_count=2" in flags  # the user's flags are kept
    assert "--xla_gpu_enable_command_buffer=" in flags  # and easyfit's own
    assert printed["warnings"] == []
    assert DETERMINISTIC_FLAG not in two_runs_each_way["false"][0]["xla_flags"]


@pytest.mark.slow
def test_two_cpu_runs_are_bit_identical_either_way(two_runs_each_way):
    on, off = two_runs_each_way["true"][1], two_runs_each_way["false"][1]
    assert on["first"].size > 15_000  # the conv, BatchNorm and dense variables
    np.testing.assert_array_equal(on["first"], on["second"])  # tolerance 0: bit for bit
    np.testing.assert_array_equal(off["first"], off["second"])
    np.testing.assert_array_equal(on["first"], off["first"])  # on a CPU the flag changes nothing


def test_a_trainer_after_the_backend_started_warns(monkeypatch):
    import jax

    jax.devices()  # the backend has started in this process
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_command_buffer=")
    with pytest.warns(RuntimeWarning, match="came after JAX started its backend"):
        trainer = ef.Trainer(SmallMLP(), deterministic=True)
    assert trainer.deterministic is True
    assert os.environ["XLA_FLAGS"] == "--xla_gpu_enable_command_buffer="  # too late: unchanged


def test_no_warning_where_the_flag_is_already_set(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", DETERMINISTIC_FLAG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ef.Trainer(SmallMLP(), deterministic=True).deterministic is True


def test_deterministic_must_be_true_or_false():
    with pytest.raises(TypeError, match=r"deterministic='yes': must be True or False"):
        ef.Trainer(SmallMLP(), deterministic="yes")
