"""Names the docstring examples use (doctests of easyfit/ and of the tests alike)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests"))


class _LazyFormats(dict):
    """``{format: root}``: small MNIST copies in each reference format, written on first use."""

    def __init__(self, base: Path):
        super().__init__()
        self.base = base

    def __missing__(self, fmt: str) -> str:
        from formats import mnist_in

        import easyfit as ef

        data = ef.datasets.sample()
        self[fmt] = mnist_in(fmt, self.base / fmt, data, (200, 100))
        return self[fmt]


@pytest.fixture(scope="session")
def _doc_formats(tmp_path_factory) -> _LazyFormats:
    return _LazyFormats(tmp_path_factory.mktemp("formats"))


@pytest.fixture(scope="session")
def _doc_idx(tmp_path_factory) -> str:
    """The packaged sample written as MNIST's four gzipped IDX files (what ``source=`` takes)."""
    from formats import write_idx_mnist

    import easyfit as ef

    return write_idx_mnist(tmp_path_factory.mktemp("idx"), ef.datasets.sample())


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace, tmp_path, _doc_formats, _doc_idx):
    doctest_namespace["DOCS_TMP"] = str(tmp_path)
    doctest_namespace["MNIST_IDX"] = _doc_idx
    doctest_namespace["MNIST_FORMATS"] = _doc_formats
