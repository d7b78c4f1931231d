"""Names the docstring examples use (doctests of easyfit/ and of the tests alike)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
MNIST_IDX = ROOT.parent / "shared" / "datasets" / "mnist"
sys.path.insert(0, str(ROOT / "tests"))


class _LazyFormats(dict):
    """``{format: root}``: small MNIST copies in each reference format, written on first use."""

    def __init__(self, base: Path):
        super().__init__()
        self.base = base

    def __missing__(self, fmt: str) -> str:
        from formats import mnist_in

        import easyfit as ef

        data = ef.datasets.mnist_arrays(MNIST_IDX)
        self[fmt] = mnist_in(fmt, self.base / fmt, data, (200, 100))
        return self[fmt]


@pytest.fixture(scope="session")
def _doc_formats(tmp_path_factory) -> _LazyFormats:
    return _LazyFormats(tmp_path_factory.mktemp("formats"))


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace, tmp_path, _doc_formats):
    doctest_namespace["DOCS_TMP"] = str(tmp_path)
    doctest_namespace["MNIST_IDX"] = str(MNIST_IDX)
    doctest_namespace["MNIST_FORMATS"] = _doc_formats
