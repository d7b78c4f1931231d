"""The one conftest: the fixtures of the tests, and the names the docstring examples use
(doctests of easyfit/ and of the tests alike). It lives at the repository root, above easyfit/
and tests/, so that both see it. Helpers the tests share are in tests/helpers/."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

collect_ignore = ["tests/programs", "tests/dali_repro"]
# the core's old module paths: each replaces itself by the moved module (a doctest would collect
# the same module twice, and each warns on import)
collect_ignore += [
    f"easyfit/training/{name}.py"
    for name in (
        "state",
        "initial_states",
        "steps",
        "losses",
        "metrics",
        "precision",
        "optimizers",
        "learning_rate",
        "multi_output",
        "models",
    )
]
# the data side's old module paths, merged into others, likewise
collect_ignore += [f"easyfit/data/{name}.py" for name in ("kinds", "fed_pipelines", "reader_pipelines")]

# The suite never writes easyfit's compilation cache into the developer's home: this process
# and every program it starts inherit the off switch (set before anything imports easyfit).
# tests/test_compilation_cache.py turns it on for its own programs, in temporary folders.
os.environ["EASYFIT_COMPILATION_CACHE"] = "0"

# Instead, the suite shares one JAX compilation cache of its own, in a temporary folder that
# the session removes at its end: its tests and the programs they start compile the same small
# models many times over (no test measures a compilation). Made by the first pytest process
# (xdist's workers inherit it), unless the developer set JAX's own; tests/test_compilation_cache.py
# and benchmarks/startup.py take these settings out of the programs whose caching they measure.
if "PYTEST_XDIST_WORKER" not in os.environ and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _JAX_CACHE = tempfile.mkdtemp(prefix="easyfit-tests-jax-cache-")
    atexit.register(shutil.rmtree, _JAX_CACHE, True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _JAX_CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    # a size cap makes JAX lock the folder (filelock): workers and the programs they start
    # read and write it at once, and unlocked writes could be read half-written
    os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(8 * 2**30)


class _LazyFormats(dict):
    """``{format: root}``: small MNIST copies in each reference format, written on first use."""

    def __init__(self, base: Path):
        super().__init__()
        self.base = base

    def __missing__(self, fmt: str) -> str:
        import easyfit as ef
        from tests.helpers.formats import mnist_in

        data = ef.datasets.sample()
        self[fmt] = mnist_in(fmt, self.base / fmt, data, (200, 100))
        return self[fmt]


@pytest.fixture(scope="session")
def _doc_formats(tmp_path_factory) -> _LazyFormats:
    return _LazyFormats(tmp_path_factory.mktemp("formats"))


@pytest.fixture(autouse=True)
def _doctest_names(request, monkeypatch, doctest_namespace, tmp_path, _doc_formats, mnist_idx):
    if isinstance(request.node, pytest.DoctestItem):
        # examples on the API page run as copied: MNIST comes from the sample, not the network
        monkeypatch.setenv("EASYFIT_MNIST_DIR", mnist_idx)
    doctest_namespace["DOCS_TMP"] = str(tmp_path)
    doctest_namespace["MNIST_IDX"] = mnist_idx
    doctest_namespace["MNIST_FORMATS"] = _doc_formats


@pytest.fixture(scope="session")
def mnist_dir(tmp_path_factory) -> str:
    """MNIST as an image folder: 3,000 training and 500 validation PNGs of the sample."""
    import easyfit as ef

    return ef.datasets.sample_folder(tmp_path_factory.mktemp("mnist") / "mnist", limit=(3000, 500))


@pytest.fixture(scope="session")
def mnist_arrays():
    """The packaged sample: the first 6,000 training and 1,000 test images of MNIST."""
    import easyfit as ef

    return ef.datasets.sample()


@pytest.fixture(scope="session")
def mnist_idx(tmp_path_factory) -> str:
    """The sample as MNIST's four gzipped IDX files, for code that takes ``source=``."""
    import easyfit as ef
    from tests.helpers.formats import write_idx_mnist

    return write_idx_mnist(tmp_path_factory.mktemp("idx"), ef.datasets.sample())


@pytest.fixture(scope="session")
def format_roots(tmp_path_factory, mnist_arrays) -> dict[str, str]:
    """MNIST (1,000 train / 300 val) as ``root/{train,val}`` in each reference format."""
    from tests.helpers.formats import mnist_in

    base = tmp_path_factory.mktemp("formats")
    return {
        fmt: mnist_in(fmt, base / fmt, mnist_arrays, (1000, 300))
        for fmt in ("lmdb", "recordio", "tfrecord", "webdataset", "npy")
    }


@pytest.fixture(scope="module")
def _module_trainer():
    import optax

    import easyfit as ef
    from tests.helpers.models import SmallMLP

    return ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0)


@pytest.fixture
def trainer(_module_trainer):
    """A SmallMLP Trainer shared by one module's tests, so its steps compile once, given to
    each test untrained (``tests.helpers.untrained``): no test depends on the ones before."""
    from tests.helpers import untrained

    return untrained(_module_trainer)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering (by fixture scope)
def pytest_collection_modifyitems(config, items):
    """The known-long tests first, spread over xdist's workers (``tests/helpers/schedule.py``):
    a test of minutes that starts last would cost its minutes with the other worker idle."""
    from tests.helpers.schedule import order

    items[:] = order(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
