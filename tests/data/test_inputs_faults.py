"""What fit is given but cannot use as given is clamped with a warning or named before tracing
(issue 27): a batch larger than the data, labels whose shape the model's output does not
take, NaN in validation data."""

from __future__ import annotations

import numpy as np
import pytest
from flax import linen as nn

import easyfit as ef
from tests.helpers import flat_params
from tests.helpers.models import SmallMLP


@pytest.fixture(scope="module")
def xy(mnist_arrays):
    x, y = mnist_arrays["train"]
    return x[:100], y[:100]


def test_a_batch_larger_than_the_data_is_clamped_to_it_with_a_warning(xy):
    inputs = ef.data.DataInputs(ef.parallel.Placement.create())
    source = ef.data.Arrays(*xy)
    assert inputs.plan(source, 10**8, shuffle=True).batch_size == 100  # padded, it never finished
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


class _Head(nn.Module):
    n: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.n)(x.reshape((x.shape[0], -1)))


def _fit(n: int, y: np.ndarray, loss=None) -> None:
    x = np.random.default_rng(0).random((64, 4), np.float32)
    ef.Trainer(_Head(n), loss=loss, seed=0).fit(x, y, epochs=1, batch_size=32, verbose=0)


def test_labels_whose_shape_the_output_does_not_take_name_both_shapes_before_tracing():
    with pytest.raises(
        ef.errors.DataError,
        match=r"^y: labels of shape \(2,\) per sample do not fit the model's output of shape \(3,\) "
        r"per sample: loss='mse' takes 3 targets per sample",
    ):
        _fit(3, np.zeros((64, 2), np.float32), loss="mse")
    with pytest.raises(ef.errors.DataError, match=r"^y: labels of shape \(2,\) .* takes one integer class"):
        _fit(3, np.zeros((64, 2), np.int32), loss="sparse_categorical_crossentropy")
    with pytest.raises(
        ef.errors.DataError, match=r"^y\['b'\]: labels of shape \(\) .* output of shape \(3,\)"
    ):
        x = np.zeros((64, 4), np.float32)
        y = {"a": np.zeros((64, 2), np.float32), "b": np.zeros(64, np.float32)}

        class Two(nn.Module):
            @nn.compact
            def __call__(self, x):
                return {"a": nn.Dense(2)(x), "b": nn.Dense(3)(x)}

        ef.Trainer(Two(), loss="mse", seed=0).fit(x, y, epochs=1, verbose=0)


def test_float_labels_with_a_10_output_model_name_the_inferred_loss_and_what_to_pass():
    with pytest.raises(
        ef.errors.DataError,
        match=r"^y: labels of shape \(\) per sample do not fit the model's output of shape \(10,\) "
        r".*loss='mse' \(none given; float labels that are not one-hot\): pass loss= explicitly, or "
        r"integer class indices \(y.astype\('int32'\)\)",
    ):
        _fit(10, np.arange(64, dtype=np.float32) % 10)


def test_labels_of_the_shapes_each_loss_takes_still_train():
    _fit(10, np.arange(64) % 10)  # class indices
    _fit(10, (np.arange(64) % 10)[:, None], loss="sparse_categorical_crossentropy")  # (n, 1)
    _fit(3, np.eye(3, dtype=np.int32)[np.arange(64) % 3], loss="categorical_crossentropy")  # one-hot
    _fit(1, np.zeros(64, np.float32), loss="binary_crossentropy")  # (n,) for an output (n, 1)


def test_a_mask_value_255_after_the_first_batch_names_its_sample(tmp_path):
    from easyfit._synthetic import write_png
    from tests.helpers.dense import TinySegmenter, write_segmentation

    masks = write_segmentation(tmp_path, 24)
    late = masks[21].copy()
    late[3, 5] = 255  # a 'void' pixel, as in Pascal VOC; the 3-class model has no class 255
    write_png(tmp_path / "masks" / "021.png", late)
    trainer = ef.Trainer(TinySegmenter(), seed=0)
    with pytest.raises(
        ef.errors.DataError,
        match=f"^{tmp_path}/images/021.png: its label holds class id 255, outside the model's 3 "
        r"outputs per pixel; class ids must be in 0..2",
    ):
        trainer.fit(str(tmp_path), epochs=1, batch_size=8, shuffle=False, verbose=0)
