"""JAX's persistent compilation cache: on by default in the per-user cache folder, read back by
a second run (with the initial state easyfit keeps beside it), the user's own JAX setting kept,
and an off switch."""

import os
import subprocess
import sys

import pytest

from easyfit._env import CACHE_SWITCH
from easyfit._info import Environment, report
from tests.helpers import PROGRAMS, ROOT, last_json

pytestmark = pytest.mark.slow  # fresh interpreters: the cache is arranged at import

_OURS = (
    CACHE_SWITCH,
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_COMPILATION_CACHE_MAX_SIZE",
)


def _env(tmp_path, **extra: str) -> dict:
    """The test process's environment without the cache settings (the suite's off switch
    included), the per-user cache in ``tmp_path/xdg``, this checkout first on the path, and
    ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if k not in _OURS}
    path = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return {**env, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": path, **extra}


def _python(env: dict, *argv: str) -> dict:
    """The JSON line that ``python *argv`` printed last, in exactly the environment ``env``."""
    return last_json(subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True))


def _after_import(env: dict, code: str = "None") -> dict:
    """What a fresh ``import easyfit`` leaves in JAX's config (after ``code`` has run)."""
    script = (
        "import json, easyfit, jax, jax.numpy as jnp;"
        f"{code};"
        "print(json.dumps({'folder': jax.config.jax_compilation_cache_dir,"
        " 'min_secs': jax.config.jax_persistent_cache_min_compile_time_secs}))"
    )
    return _python(env, "-c", script)


def _files(folder) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs}


def test_a_fit_fills_the_per_user_cache_and_a_second_run_reads_it(tmp_path):
    folder = tmp_path / "xdg" / "easyfit" / "jax"
    data = str(tmp_path / "mnist")
    first = _python(_env(tmp_path), str(PROGRAMS / "cache_fit.py"), data)
    written = _files(folder)
    states = tmp_path / "xdg" / "easyfit" / "states"
    assert first == {"folder": str(folder), "hits": 0, "state_read": False}  # a cold cache
    assert any(name.endswith("-cache") for name in written), written
    assert len(_files(states)) == 1  # the initial state, kept
    second = _python(_env(tmp_path), str(PROGRAMS / "cache_fit.py"), data)
    assert second["folder"] == str(folder) and second["state_read"]
    # every entry read but the initialisation's program: its state is read instead
    assert second["hits"] >= sum(name.endswith("-cache") for name in written) - 1
    assert _files(folder) == written  # nothing compiled again, so nothing new written
    assert len(_files(states)) == 1


def test_a_users_own_jax_cache_folder_and_threshold_are_kept(tmp_path):
    mine = str(tmp_path / "mine")
    seen = _after_import(_env(tmp_path, JAX_COMPILATION_CACHE_DIR=mine), "jnp.ones(3).sum()")
    assert seen == {"folder": mine, "min_secs": 1.0}  # JAX's own threshold, untouched
    assert not (tmp_path / "xdg").exists()
    seen = _after_import(_env(tmp_path, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="2.5"))
    assert seen == {"folder": str(tmp_path / "xdg" / "easyfit" / "jax"), "min_secs": 2.5}


@pytest.mark.parametrize("value", ["0", ""])
def test_the_off_switch_leaves_the_cache_off(tmp_path, value):
    seen = _after_import(_env(tmp_path, **{CACHE_SWITCH: value}), "jax.jit(lambda x: x * 2)(jnp.ones(3))")
    assert seen["folder"] is None
    assert not (tmp_path / "xdg").exists()  # nothing written anywhere easyfit would choose


def test_info_shows_where_the_cache_is():
    env = Environment(python="3.11.9", versions={}, compilation_cache="/c/easyfit/jax (easyfit's default)")
    rows = [line.split(None, 1) for line in report(env).splitlines()]
    assert ["jax_compilation_cache_dir", "/c/easyfit/jax (easyfit's default)"] in rows
