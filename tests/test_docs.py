"""Every ```python block of README.md and docs/*.md runs; the docs site builds with --strict.

The blocks of one file run in order in one fresh interpreter (like a notebook), in an empty
temporary folder, offline: MNIST's download mirror is an unreachable local address and the
cache an empty folder, so a block that needs the network fails (blocks use the packaged
sample). A file can ask for virtual CPU devices with an HTML comment, invisible on the site:
``<!-- docs-test: devices=4 -->``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
OFFLINE = "http://127.0.0.1:9/"  # the discard port: refused at once, as with no network
_BLOCK = re.compile(r"^([ \t]*)```python[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)
_DEVICES = re.compile(r"<!--\s*docs-test:\s*devices=(\d+)\s*-->")

# Runs each block with its line numbers in the Markdown file, so tracebacks point there.
_RUNNER = """
import json, sys
page, blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
for line, code in blocks:
    print(f"--- {page}:{line}", flush=True)
    exec(compile("\\n" * line + code, page, "exec"), namespace)
"""


def blocks(text: str) -> list[tuple[int, str]]:
    """``(line of the block's first code line - 1, dedented code)`` for every python block."""
    return [(text.count("\n", 0, m.start(2)), textwrap.dedent(m.group(2))) for m in _BLOCK.finditer(text)]


def test_blocks_are_found_with_their_lines():
    text = "intro\n```python\nx = 1\n```\n\n!!! note\n    ```python\n    y = x\n    ```\n"
    assert blocks(text) == [(2, "x = 1\n"), (7, "y = x\n")]


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p.read_text())], ids=lambda p: p.name)
def test_code_blocks_run(page, tmp_path):
    text = page.read_text()
    found = blocks(text)
    devices = int(m.group(1)) if (m := _DEVICES.search(text)) else 1
    env = {k: v for k, v in os.environ.items() if k != "EASYFIT_MNIST_DIR"}
    env = {
        **env,
        "EASYFIT_MNIST_MIRROR": OFFLINE,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PYTHONUNBUFFERED": "1",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    name = str(page.relative_to(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps([name, found]),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{name}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-q",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "Trains a Flax model on data read by DALI" in api  # the docstrings made it in
    assert not re.findall(r":(?:meth|func|class|attr|mod|exc):", api)  # roles rendered as code
    ids = set(re.findall(r'id="(easyfit\.[\w.]+)"', api))
    assert {
        "easyfit.Trainer.fit",
        "easyfit.Trainer.evaluate",
        "easyfit.data.Source.num_samples",
        "easyfit.optimizers.get_optimizer",
    } <= ids
    internal = {
        "easyfit.data.Source.feed",
        "easyfit.data.Source.graph",
        "easyfit.data.Plan.chunk",
        "easyfit.callbacks.Callback.set_params",
        "easyfit.parallel.Placement.replicate",
    }
    assert not ids & internal
