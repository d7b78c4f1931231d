"""Initial states kept on disk (easyfit.core.initial_states): a re-run of an unchanged
script reads the state its seed gave, bit for bit, and initialises nothing; anything that
changes the state is a new entry; a damaged entry, the caches switched off or a folder that
cannot be written cost only the reading."""

from __future__ import annotations

import logging
import os
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

import easyfit as ef
from easyfit.core.models import adapt
from easyfit.core.state import StateMaker
from easyfit.training import initial_states
from tests.helpers import flat_params


class Small(nn.Module):
    features: int = 8
    scale: float = 1.0

    @nn.compact
    def __call__(self, x, train: bool = False):
        dense = nn.Dense(self.features, kernel_init=nn.initializers.normal(self.scale))
        x = dense(x.reshape((x.shape[0], -1)))
        x = nn.BatchNorm(use_running_average=not train)(x)
        return nn.Dense(10)(nn.relu(x))


@pytest.fixture
def kept(tmp_path, monkeypatch) -> str:
    """The caches on, in a folder of this test's: where the states go."""
    monkeypatch.setenv("EASYFIT_COMPILATION_CACHE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = initial_states.folder()
    assert folder == str(tmp_path / "cache" / "easyfit" / "states")
    return folder


class _Compiles(logging.Handler):
    """How many times JAX logs compiling the initialisation (``jax_log_compiles``)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Compiling jit(_fresh)"):
            self.count += 1


def _make(model=None, tx=None, seed=0, ema=False, host="auto") -> tuple[object, int]:
    """A fresh StateMaker's state (a new jit: nothing of an earlier one is reused in this
    process), and how many times the initialisation compiled for it. ``host``: StateMaker's
    (a CPU device: the path of accelerator machines, where the state is made on the host)."""
    handler, logger = _Compiles(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            tx = tx or optax.sgd(0.1, momentum=0.9)
            maker = StateMaker(adapt(model or Small())[0], tx, ema=ema, host=host)
            state = maker.make(seed, (4, 4, 1))
    finally:
        logger.removeHandler(handler)
    return state, handler.count


def _entries(folder: str) -> list[str]:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def _leaves(state) -> list[np.ndarray]:
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(state)]


@pytest.mark.parametrize("on_host", [False, True])
def test_a_rerun_reads_the_kept_state_bit_for_bit_and_compiles_no_initialisation(kept, on_host):
    host = jax.local_devices(backend="cpu")[0] if on_host else "auto"
    first, compiled = _make(ema=True, host=host)
    assert compiled == 1 and len(_entries(kept)) == 1
    again, compiled = _make(ema=True, host=host)
    assert compiled == 0  # read back: the initialisation is not lowered, compiled nor run
    assert _entries(kept) == _entries(kept)[:1]
    for a, b in zip(_leaves(first), _leaves(again), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)  # exact
    leaves = jax.tree_util.tree_leaves(again)
    assert all(a.devices() == {jax.devices()[0]} and not a.committed for a in leaves)  # as computed
    pointers = [a.unsafe_buffer_pointer() for a in leaves]
    assert len(set(pointers)) == len(pointers)  # no two leaves share a buffer: the step donates each


def test_a_fit_from_a_kept_state_trains_as_one_from_a_computed_state(kept, tmp_path):
    root = ef.datasets.sample_folder(str(tmp_path / "mnist"), limit=(64, 32))
    params = []
    for _ in range(2):  # the first computes and keeps the state, the second reads it
        trainer = ef.Trainer(Small(), optimizer="adam", seed=3, ema_momentum=0.9)
        trainer.fit(root + "/train", epochs=1, batch_size=16, verbose=0, cache=False)
        params.append(flat_params(trainer.state.params))
    assert len(_entries(kept)) == 1
    np.testing.assert_array_equal(params[0], params[1])  # bit for bit (CPU)


@pytest.mark.parametrize(
    "change",
    ["seed", "features", "initialiser's scale", "optimizer", "moving average"],
)
def test_what_changes_the_initial_state_is_a_new_entry_and_initialises_anew(kept, change):
    base, _ = _make()
    changed = {
        "seed": dict(seed=1),
        "features": dict(model=Small(features=9)),
        "initialiser's scale": dict(model=Small(scale=0.5)),
        "optimizer": dict(tx=optax.adam(1e-3)),
        "moving average": dict(ema=True),
    }[change]
    state, compiled = _make(**changed)
    assert compiled == 1 and len(_entries(kept)) == 2
    fresh_maker = StateMaker(
        adapt(changed.get("model", Small()))[0],
        changed.get("tx", optax.sgd(0.1, momentum=0.9)),
        ema=changed.get("ema", False),
    )
    with pytest.MonkeyPatch.context() as mp:  # the same state computed with the caches off
        mp.setenv("EASYFIT_COMPILATION_CACHE", "0")
        fresh = fresh_maker.make(changed.get("seed", 0), (4, 4, 1))
    for a, b in zip(_leaves(state), _leaves(fresh), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_damaged_entry_is_initialised_anew_and_replaced(kept, caplog):
    first, _ = _make()
    (name,) = _entries(kept)
    path = os.path.join(kept, name)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF  # one bit pattern flipped inside a leaf
    open(path, "wb").write(bytes(data))
    with caplog.at_level(logging.INFO, logger="easyfit"):
        again, compiled = _make()
    assert compiled == 1 and "CRC-32C does not match" in caplog.text and name in caplog.text
    for a, b in zip(_leaves(first), _leaves(again), strict=True):
        np.testing.assert_array_equal(a, b)
    assert _make()[1] == 0  # the entry written anew is whole


def test_an_entry_cut_short_is_initialised_anew(kept):
    _make()
    (name,) = _entries(kept)
    path = os.path.join(kept, name)
    os.truncate(path, os.path.getsize(path) - 100)
    assert _make()[1] == 1


def test_an_entry_whose_header_claims_another_size_is_a_miss_and_nothing_is_allocated(kept, caplog):
    first, _ = _make()
    (name,) = _entries(kept)
    path = os.path.join(kept, name)
    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in _leaves(first)]
    with open(path, "rb") as f:
        assert np.lib.format.read_magic(f) == (1, 0)
        np.lib.format.read_array_header_1_0(f)
        data = f.read()  # the entry's bytes and CRC, as written
    # 1 TiB: np.load's allocation raised MemoryError, which stopped every fit; 256 MiB: allocated,
    # then read short
    for claimed in (1 << 40, 1 << 28):
        with open(path, "wb") as f:
            header = {"descr": "|u1", "fortran_order": False, "shape": (claimed,)}
            np.lib.format.write_array_header_1_0(f, header)
            f.write(data)
        tracemalloc.start()
        try:
            with caplog.at_level(logging.WARNING, logger="easyfit"):
                assert initial_states.read(name.removesuffix(".npy"), abstract) is None
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 24, peak  # the claim is never allocated
        said = f"its header claims {claimed} bytes of data, the file holds {len(data)}"
        assert said in caplog.text and name in caplog.text
    again, compiled = _make()  # the fit goes on: computed anew, kept whole
    assert compiled == 1 and _make()[1] == 0
    for a, b in zip(_leaves(first), _leaves(again), strict=True):
        np.testing.assert_array_equal(a, b)


def test_with_the_caches_off_no_state_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("EASYFIT_COMPILATION_CACHE", "0")
    assert initial_states.folder() is None
    assert _make()[1] == 1 and _make()[1] == 1
    assert not (tmp_path / "cache").exists()


def test_a_folder_that_cannot_be_written_is_a_warning_and_the_state_is_made(tmp_path, monkeypatch, caplog):
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("EASYFIT_COMPILATION_CACHE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    with caplog.at_level(logging.WARNING, logger="easyfit"):
        state, compiled = _make()
    assert compiled == 1 and "could not keep the initial state" in caplog.text
    assert len(jax.tree_util.tree_leaves(state)) > 0


def _key(letter: str) -> str:
    """A key as state_key names them (64 hexadecimal digits)."""
    return letter * 64


def test_the_folder_keeps_the_latest_entries_within_its_cap(kept, monkeypatch):
    leaves = [np.arange(1000, dtype=np.float32), np.ones((3, 5), np.int8), np.full((2,), 1.5, jnp.bfloat16)]
    size = 4096 + 64 + 64 + 4 + 4 + 128  # one entry with its .npy header, about
    monkeypatch.setattr(initial_states, "MAX_BYTES", 2 * size)
    for i, key in enumerate("abc"):
        initial_states.write(_key(key), leaves)
        os.utime(os.path.join(kept, _key(key) + ".npy"), (1000 + i, 1000 + i))  # distinct ages
    assert _entries(kept) == [_key("b") + ".npy", _key("c") + ".npy"]  # the least recently used went
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in leaves]
    assert initial_states.read(_key("b"), specs) is not None  # read: now the most recently used
    initial_states.write(_key("d"), leaves)
    assert _entries(kept) == [_key("b") + ".npy", _key("d") + ".npy"]
    got = initial_states.read(_key("d"), specs)
    for a, b in zip(got, leaves, strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    assert initial_states.read(_key("d"), specs[::-1]) is None  # not of those shapes: a miss
    monkeypatch.setattr(initial_states, "MAX_BYTES", 100)
    initial_states.write(_key("e"), leaves)  # larger than the cap: not kept
    assert _key("e") + ".npy" not in _entries(kept)


def test_what_a_writer_killed_midway_left_goes_at_the_next_write_and_a_live_one_stays(kept):
    leaves = [np.arange(10, dtype=np.float32)]
    initial_states.write(_key("a"), leaves)
    stale, live = os.path.join(kept, ".writing-stale.npy"), os.path.join(kept, ".writing-live.npy")
    for path in (stale, live):
        open(path, "wb").write(b"half an entry")
    os.utime(stale, (1000, 1000))  # long ago: no process writes it any more
    initial_states.write(_key("b"), leaves)
    assert _entries(kept) == [".writing-live.npy", _key("a") + ".npy", _key("b") + ".npy"]


def test_files_the_folder_holds_that_easyfit_did_not_name_are_never_touched(kept, monkeypatch):
    """Canaries: whatever else is in the folder (an array someone saved there, a note, a file
    named like a temporary one but not mkstemp's), old and large, survives trimming."""
    os.makedirs(kept)
    canaries = {
        "mine.npy": np.arange(5000, dtype=np.float64).tobytes(),
        "notes.txt": b"do not delete",
        ".writing-by hand.npy": b"not a temporary name of ours",
        _key("a") + ".npy.bak": b"a copy",
    }
    for name, data in canaries.items():
        path = os.path.join(kept, name)
        open(path, "wb").write(data)
        os.utime(path, (1000, 1000))  # older than any entry and than _STALE_SECONDS
    monkeypatch.setattr(initial_states, "MAX_BYTES", 100)  # every entry over the cap
    leaves = [np.arange(10, dtype=np.float32)]
    initial_states.write(_key("a"), leaves)
    monkeypatch.setattr(initial_states, "MAX_BYTES", 1000)
    initial_states.write(_key("b"), leaves)
    initial_states.write(_key("c"), leaves)  # trims a or b: never a canary
    for name, data in canaries.items():
        assert open(os.path.join(kept, name), "rb").read() == data, name
    assert _key("c") + ".npy" in _entries(kept)
