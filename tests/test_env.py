"""easyfit arranges XLA_FLAGS for DALI before JAX starts."""

import os
import subprocess
import sys

import pytest


def _flags_after_import(env_flags):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if env_flags is not None:
        env["XLA_FLAGS"] = env_flags
    code = "import easyfit, os; print(os.environ.get('XLA_FLAGS', ''))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.slow
def test_import_turns_off_command_buffers():
    assert _flags_after_import(None) == "--xla_gpu_enable_command_buffer="
    assert _flags_after_import("--xla_force_host_platform_device_count=2") == (
        "--xla_force_host_platform_device_count=2 --xla_gpu_enable_command_buffer="
    )


@pytest.mark.slow
def test_a_users_own_setting_is_kept():
    mine = "--xla_gpu_enable_command_buffer=FUSION"
    assert _flags_after_import(mine) == mine
