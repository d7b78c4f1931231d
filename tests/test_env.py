"""easyfit arranges XLA_FLAGS and CUDA's work queues for DALI before JAX starts."""

import os
import subprocess
import sys

import pytest

_CODE = (
    "import easyfit, os; print(os.environ.get('XLA_FLAGS', ''));"
    " print(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS'))"
)


def _after_import(env_flags=None, connections=None, code=_CODE):
    """(XLA_FLAGS, CUDA_DEVICE_MAX_CONNECTIONS) as a fresh process sees them after ``code``."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "CUDA_DEVICE_MAX_CONNECTIONS")}
    if env_flags is not None:
        env["XLA_FLAGS"] = env_flags
    if connections is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = connections
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    flags, queues = out.stdout.splitlines()[-2:]
    return flags, queues


@pytest.mark.slow
def test_import_turns_off_command_buffers_and_gives_cuda_32_queues():
    assert _after_import() == ("--xla_gpu_enable_command_buffer=", "32")
    assert _after_import("--xla_force_host_platform_device_count=2")[0] == (
        "--xla_force_host_platform_device_count=2 --xla_gpu_enable_command_buffer="
    )


@pytest.mark.slow
def test_a_users_own_settings_are_kept():
    mine = "--xla_gpu_enable_command_buffer=FUSION"
    assert _after_import(mine, "4") == (mine, "4")


@pytest.mark.slow
def test_nothing_is_set_once_jax_has_started():
    late = "import jax; jax.devices(); " + _CODE
    assert _after_import(code=late) == ("", "None")
