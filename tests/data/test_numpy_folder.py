"""Folders of .npy files: NaN/inf, values JAX would narrow and Fortran order are named, never
trained on (issue 17)."""

from __future__ import annotations

import numpy as np
import pytest

import easyfit as ef
from tests.helpers.formats import write_npy_folder


@pytest.fixture
def floats(tmp_path):
    x = np.random.default_rng(0).normal(size=(16, 6)).astype(np.float32)
    return tmp_path / "npy", x, np.arange(16) % 2


def test_a_nan_inside_a_npy_folder_is_named_like_in_arrays(floats, trainer):
    root, x, y = floats
    x[9, 4] = np.nan
    write_npy_folder(root, x, y)
    with pytest.raises(
        ef.errors.DataError, match=rf"^{root}/1/00009.npy: holds NaN or inf \(first at element 4\)"
    ):
        trainer.fit(str(root), epochs=1, batch_size=16, verbose=0)
    with pytest.raises(ef.errors.DataError, match=r"^x holds NaN or inf \(first at sample 9\)"):
        ef.data.Arrays(x, y)


def test_a_fortran_order_npy_file_is_named(floats, trainer):
    root, _, y = floats
    x = np.random.default_rng(0).normal(size=(16, 4, 3)).astype(np.float32)
    write_npy_folder(root, x, y)
    np.save(root / "0" / "00004.npy", np.asfortranarray(x[4]))
    with pytest.raises(
        ef.errors.DataError, match=rf"^{root}/0/00004.npy: a Fortran-order array; DALI's numpy decoder"
    ):
        trainer.fit(str(root), epochs=1, batch_size=16, verbose=0)


def test_an_int64_value_jax_would_wrap_inside_a_npy_folder_is_named(floats, trainer):
    root, _, y = floats
    x = np.arange(16 * 6, dtype=np.int64).reshape(16, 6)
    x[9, 4] = 2**40  # JAX (x64 off) would make it 0
    write_npy_folder(root, x, y)
    with pytest.raises(
        ef.errors.DataError, match=rf"^{root}/1/00009.npy: value 1099511627776 at \[4\] does not fit int32"
    ):
        trainer.fit(str(root), epochs=1, batch_size=16, verbose=0)
