"""fit's start-up: the model initialises in a thread while the input pipelines start, when the
source knows its input shape before any batch (``Source.known_input_shape``), and the result is
that of initialising from the first batch, bit for bit."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from flax import linen as nn

import easyfit as ef
from tests.helpers import flat_params


class Notes:
    """Where a Recorder writes (an object: flax would freeze a list field into a tuple)."""

    def __init__(self):
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        self.traced = threading.Event()


class Recorder(nn.Module):
    """A tiny classifier that notes, each time it is traced or run, the thread and the shape of
    one input sample."""

    notes: Any

    @nn.compact
    def __call__(self, x, train: bool = False):
        self.notes.calls.append((threading.current_thread().name, tuple(x.shape[1:])))
        self.notes.traced.set()
        return nn.Dense(10)(nn.relu(nn.Dense(8)(x.reshape((x.shape[0], -1)))))


class Unknown(ef.data.ImageFolder):
    """An ImageFolder that does not say its input shape: fit initialises from the first batch."""

    def known_input_shape(self):
        return None


class Wrong(ef.data.ImageFolder):
    """An ImageFolder that says a wrong input shape: fit must notice and initialise again."""

    def known_input_shape(self):
        return [3, 3, 3]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return ef.datasets.sample_folder(str(tmp_path_factory.mktemp("startup") / "mnist"), limit=(96, 32))


@pytest.fixture(scope="module")
def reference(root) -> np.ndarray:
    """The parameters of a fit that initialises from the first batch."""
    params, calls = _fit(Unknown(root + "/train"))
    assert not any(c[0] == "easyfit-init" for c in calls)
    return params


def _fit(source) -> tuple[np.ndarray, list]:
    notes = Notes()
    trainer = ef.Trainer(Recorder(notes), optimizer="sgd", seed=3)
    trainer.fit(source, epochs=1, batch_size=32, verbose=0, cache=False)
    return flat_params(trainer.state.params), notes.calls


class WaitsForTheModel(ef.data.ImageFolder):
    """An ImageFolder whose pipelines start only once the model has been traced: fit would
    wait forever (here 60 s, then fail) if it initialised the model after the input started."""

    notes: Notes

    def check(self):
        super().check()
        assert self.notes.traced.wait(timeout=60), "the model did not initialise while the input started"


def test_the_model_initialises_while_the_input_starts_traced_once_as_from_the_first_batch(root, reference):
    notes = Notes()
    source = WaitsForTheModel(root + "/train")
    source.notes = notes
    trainer = ef.Trainer(Recorder(notes), optimizer="sgd", seed=3)
    trainer.fit(source, epochs=1, batch_size=32, verbose=0, cache=False)
    init = [c for c in notes.calls if c[0] == "easyfit-init"]
    assert init == [("easyfit-init", (28, 28, 1))]  # traced once, for the batch's shape
    np.testing.assert_array_equal(flat_params(trainer.state.params), reference)  # bit for bit (CPU)


def test_a_known_shape_that_is_not_the_batchs_is_replaced_by_the_batchs(root, reference):
    params, calls = _fit(Wrong(root + "/train"))
    assert (3, 3, 3) in [shape for _, shape in calls]  # made ahead for the wrong shape...
    np.testing.assert_array_equal(params, reference)  # ...then made again for the right one


def test_an_error_of_the_models_initialisation_is_raised_by_fit(root):
    class Broken(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            raise ValueError("the model's own error")

    before = threading.active_count()
    with pytest.raises(ValueError, match="the model's own error"):
        ef.Trainer(Broken(), optimizer="sgd").fit(root + "/train", epochs=1, batch_size=32, verbose=0)
    assert threading.active_count() == before  # the initialising thread ended too


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda root, formats: ef.data.ImageFolder(root + "/train", color_mode="rgb"), id="rgb"),
        pytest.param(
            lambda root, formats: ef.data.ImageFolder(
                root + "/train", image_size=(20, 24), normalize=(0.5, 0.25), augment=ef.data.Augment()
            ),
            id="resized-normalized-augmented",
        ),
        pytest.param(
            lambda root, formats: ef.data.Arrays(np.zeros((64, 5, 3), np.float32), np.zeros(64, np.int32)),
            id="arrays",
        ),
        pytest.param(lambda root, formats: ef.data.TFRecord(formats["tfrecord"] + "/train"), id="tfrecord"),
    ],
)
def test_a_known_input_shape_is_the_first_batchs(make, root, format_roots):
    source = make(root, format_roots)
    known = source.known_input_shape()
    assert known is not None
    _, calls = _fit(source)
    trained = [shape for thread, shape in calls if thread != "easyfit-init"]
    assert trained and all(list(shape) == known for shape in trained)


def test_a_transform_leaves_the_shape_to_the_first_batch(root):
    assert ef.data.ImageFolder(root + "/train", transform=lambda images: images).known_input_shape() is None
