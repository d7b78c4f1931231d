"""Doctest names for the docstrings' examples: a temporary folder and the local MNIST copy."""

from pathlib import Path

import pytest

MNIST_IDX = Path(__file__).resolve().parent.parent / "shared" / "datasets" / "mnist"


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace, tmp_path):
    doctest_namespace["DOCS_TMP"] = str(tmp_path)
    doctest_namespace["MNIST_IDX"] = str(MNIST_IDX)
