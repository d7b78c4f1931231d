"""Without a network, ef.datasets.mnist() says what to do instead of a urllib traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

_PROGRAM = """
import easyfit as ef
try:
    ef.datasets.mnist("digits", limit=(10, 10))
except ef.DataError as e:
    print("DataError:", e)
else:
    print("downloaded")
"""


def test_mnist_without_network_names_the_sample_and_source(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "EASYFIT_MNIST_DIR"}
    env.update(EASYFIT_MNIST_MIRROR="http://127.0.0.1:9/", XDG_CACHE_HOME=str(tmp_path / "c"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", _PROGRAM], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("DataError: could not download MNIST from http://127.0.0.1:9/"), out
    assert "ef.datasets.sample_folder(" in out and "source=" in out
    assert "Traceback" not in proc.stderr
    assert not [f for f in os.listdir(tmp_path / "c" / "easyfit" / "mnist")]  # no partial file
