"""Arrays reach the model with the values given: a 64-bit integer JAX would wrap, or a float64
that would overflow float32, is refused by name, index and value, before anything is traced."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import easyfit as ef
from easyfit.errors import DataError


class Echo(nn.Module):
    """Returns its input ``ids`` (of a dict, a tuple or alone) as float32, plus a zero weight."""

    @nn.compact
    def __call__(self, x):
        ids = x["ids"] if isinstance(x, dict) else x[0] if isinstance(x, tuple) else x
        return ids.astype(jnp.float32) + self.param("w", nn.initializers.zeros, (1,))


@pytest.mark.parametrize(
    "dtype, big, fits", [(np.int64, 3_000_000_000, "int32"), (np.uint64, 2**40, "uint32")]
)
def test_64_bit_integer_inputs_that_jax_would_wrap_are_refused_by_name(dtype, big, fits):
    x = np.array([[5], [7], [big], [2**40]], dtype)  # JAX (x64 off) made them -1294967296 or 0
    y = np.zeros(4, np.float32)
    said = rf"value {big} at \[2, 0\] does not fit {fits} "
    with ef.Trainer(Echo(), loss="mse") as t:
        with pytest.raises(DataError, match=rf"^x: {said}"):
            t.fit(x, y, batch_size=2, verbose=0)
        with pytest.raises(DataError, match=rf"^x\['ids'\]: {said}"):
            t.evaluate({"ids": x, "other": np.zeros((4, 2))}, y, batch_size=2, verbose=0)
        with pytest.raises(DataError, match=rf"^x\[0\]: {said}"):
            t.predict((x, np.zeros((4, 2))), batch_size=2, verbose=0)
        # validation data is adopted the same way
        with pytest.raises(DataError, match=rf"validation_data.*x\['ids'\]: {said}"):
            t.fit({"ids": x[:2]}, y[:2], validation_data=({"ids": x}, y), batch_size=2, verbose=0)
        # values that fit reach the model unchanged, in fit's evaluation and in predict
        fine = np.array([[-(2**31)], [5], [2**24], [2**31 - 128]], np.int64)
        if dtype == np.uint64:
            fine = np.array([[0], [5], [2**24], [2**32 - 256]], np.uint64)
        np.testing.assert_array_equal(t.predict({"ids": fine}, batch_size=2, verbose=0), fine, strict=False)


def test_float64_values_that_float32_cannot_hold_are_refused_by_name():
    x = np.array([[1.0], [3e38], [1e300], [-1e39]])  # 3e38 fits; 1e300 would become inf
    y, ones = np.zeros(4), x[:1].repeat(4, 0)
    said = r"value 1e\+300 at \[2, 0\] is beyond float32's range"
    with ef.Trainer(Echo(), loss="mse") as t:
        with pytest.raises(DataError, match=rf"^x: {said}"):
            t.fit(x, y, batch_size=2, verbose=0)
        with pytest.raises(DataError, match=rf"^x\['ids'\]: {said}"):
            t.predict({"ids": x}, batch_size=2, verbose=0)
        with pytest.raises(DataError, match=r"^y\[1\]: value 1e\+300 at \[2\] is beyond"):
            t.evaluate(ones, (y, np.array([1.0, 2.0, 1e300, 0.0])), batch_size=2, verbose=0)
        with pytest.raises(DataError, match=r"^sample_weight: value 1e\+300 at \[2\] is beyond"):
            t.fit(ones, y, sample_weight=np.array([1.0, 1.0, 1e300, 1.0]), batch_size=2, verbose=0)


def test_integer_inputs_reach_a_bfloat16_model_exactly_or_are_refused():
    """Token ids under ``precision="bfloat16"``: 257 and 2049 were rounded to 256 and 2048 on
    their way in (the compute dtype); they now reach the model as float32, exactly. A value
    float32 cannot hold (2**24 + 1) is refused by name, index and value."""
    ids = np.array([[0], [257], [2049], [2**24]], np.int32)
    with ef.Trainer(Echo(), loss="mse", precision="bfloat16") as t:
        np.testing.assert_array_equal(t.predict(ids, batch_size=2, verbose=0), ids, strict=False)
        too_big = np.array([[1], [2**24 + 1]], np.int32)
        with pytest.raises(DataError, match=r"^x: value 16777217 at \[1, 0\] would be rounded"):
            t.predict(too_big, batch_size=2, verbose=0)
