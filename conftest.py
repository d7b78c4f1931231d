"""Names the docstrings' examples use, for doctests anywhere in the repository.

``DOCS_TMP``: a fresh temporary folder; ``MNIST_IDX``: the folder with MNIST's IDX files.
(tests/conftest.py sets the same names for the tests under tests/.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

MNIST_IDX = Path(__file__).resolve().parent.parent / "shared" / "datasets" / "mnist"


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace, tmp_path):
    doctest_namespace["DOCS_TMP"] = str(tmp_path)
    doctest_namespace["MNIST_IDX"] = str(MNIST_IDX)

# tests/programs/ holds scripts the tests run in subprocesses: not modules to import for doctests.
collect_ignore = ["tests/programs"]
