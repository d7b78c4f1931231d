"""What fit is given but cannot use as given is clamped with a warning or named before tracing
(issue 27): a batch larger than the data, labels whose shape the model's output does not
take, NaN in validation data."""

from __future__ import annotations

import numpy as np
import pytest

import easyfit as ef
from tests.helpers import flat_params
from tests.helpers.models import SmallMLP


@pytest.fixture(scope="module")
def xy(mnist_arrays):
    x, y = mnist_arrays["train"]
    return x[:100], y[:100]


def test_a_batch_larger_than_the_data_is_clamped_to_it_with_a_warning(xy):
    door = ef.data.DataDoor(ef.parallel.Placement.create())
    source = ef.data.Arrays(*xy)
    assert door.plan(source, 10**8, shuffle=True).batch_size == 100  # padded, it never finished
    trained = {}
    for batch_size in (100, 1000):
        trainer = ef.Trainer(SmallMLP(), seed=0)
        if batch_size > 100:
            with pytest.warns(UserWarning, match="^batch_size=1000 is larger than the 100 samples of Arr"):
                trainer.fit(*xy, batch_size=batch_size, epochs=2, verbose=0)
        else:
            trainer.fit(*xy, batch_size=batch_size, epochs=2, verbose=0)
        trained[batch_size] = flat_params(trainer.state.params)
    np.testing.assert_allclose(trained[1000], trained[100], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("where", ["x", "y"])
def test_nan_in_validation_data_names_validation_data(xy, where):
    x, y = xy[0][:20].astype(np.float32), xy[1][:20].astype(np.float32)
    bad = {"x": x.copy(), "y": y.copy()}
    bad[where][3] = np.nan
    with pytest.raises(
        ef.errors.DataError, match=rf"^validation_data: {where} holds NaN or inf \(first at sample 3\)"
    ):
        ef.Trainer(SmallMLP(), loss="mse", seed=0).fit(
            x, y, validation_data=(bad["x"], bad["y"]), epochs=1, verbose=0
        )
