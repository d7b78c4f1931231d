"""Device-cached training: the same samples in the same steps as streaming, from device memory."""

from __future__ import annotations

import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.data.loader import decide_cache
from easyfit.parallel import Placement
from tests.helpers import flat_params
from tests.helpers.models import SmallMLP


def _fit(root, cache, epochs=3):
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0, steps_per_execution=5)
    history = trainer.fit(root, epochs=epochs, batch_size=100, verbose=0, cache=cache)
    return trainer, history


def test_cached_training_equals_streaming_bit_for_bit(mnist_dir):
    streamed, h1 = _fit(mnist_dir, cache=False)
    cached, h2 = _fit(mnist_dir, cache=True)
    assert np.array_equal(flat_params(streamed.params), flat_params(cached.params))
    h1.history.pop("input_wait")  # a timing, not a result
    h2.history.pop("input_wait")
    assert h1.history == h2.history


def test_auto_caches_what_fits_and_streams_what_does_not(mnist_dir):
    placement = Placement.create()
    folder = ef.data.ImageFolder(mnist_dir + "/train")
    assert decide_cache("auto", folder, placement)[0]
    assert not decide_cache(False, folder, placement)[0]
    huge = ef.data.ImageFolder(mnist_dir + "/train", image_size=(30_000, 30_000))
    use, why = decide_cache("auto", huge, placement)
    assert not use and "would not fit" in why
    augmented = ef.data.ImageFolder(mnist_dir + "/train", augment=ef.data.Augment(flip=True))
    use, why = decide_cache("auto", augmented, placement)
    assert not use and "random" in why
    with pytest.raises(ValueError, match="augmentation"):
        decide_cache(True, augmented, placement)
    with pytest.raises(ValueError, match="cache="):
        decide_cache("always", folder, placement)
