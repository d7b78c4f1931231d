"""Am I input-bound? fit measures the share of each epoch the devices waited for input, logs it
as ``input_wait`` and, after the first epoch, says so when it is large."""

from __future__ import annotations

import time

import optax
from flax import linen as nn

import easyfit as ef


class SlowArrays(ef.data.Arrays):
    """Arrays whose host side takes 30 ms a run: an input pipeline slower than the model."""

    def feed(self, indices):
        time.sleep(0.03)
        return super().feed(indices)


def _model():
    return nn.Sequential([lambda x: x.reshape((x.shape[0], -1)), nn.Dense(10)])


def _data():
    x, y = ef.datasets.sample()["train"]
    return x[:600], y[:600]


def test_a_slow_source_is_called_input_bound(capsys):
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer=optax.sgd(0.1), steps_per_execution=1)
    history = trainer.fit(SlowArrays(x, y, scale=1 / 255), epochs=2, batch_size=50, verbose=1, cache=False)
    waits = history.history["input_wait"]
    assert len(waits) == 2 and min(waits) > 0.5, waits
    out = capsys.readouterr().out
    assert "the devices waited for input" in out and "of epoch 1" in out
    assert "docs/performance.md#am-i-input-bound" in out
    assert "of epoch 2" not in out  # said once, after the first epoch


def test_input_from_the_device_cache_is_not_waited_for(capsys):
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer=optax.sgd(0.1), steps_per_execution=1)
    history = trainer.fit(ef.data.Arrays(x, y, scale=1 / 255), epochs=3, batch_size=50, verbose=0, cache=True)
    assert 0.0 <= history.history["input_wait"][-1] < 0.25, history.history["input_wait"]
    assert "waited for input" not in capsys.readouterr().out
