"""Am I input-bound? fit measures the share of each epoch the devices waited for input, logs it
as ``input_wait`` and, after the first epoch, says so when it is large."""

from __future__ import annotations

import time

import optax
from flax import linen as nn

import easyfit as ef
from easyfit.training.input_wait import INPUT_BOUND


class SlowArrays(ef.data.Arrays):
    """Arrays whose host side is ``SLOWER`` times slower than everything else, however loaded
    the machine: each run sleeps ``SLOWER`` times as long as passed since the previous run
    ended (the time the training loop spent outside the input), from 5 ms to 0.5 s, so a load
    that slows training slows the input as much."""

    SLOWER = 5
    last: float | None = None

    def feed(self, indices):
        since = 0.0 if self.last is None else time.perf_counter() - self.last
        time.sleep(min(max(self.SLOWER * since, 0.005), 0.5))
        try:
            return super().feed(indices)
        finally:
            self.last = time.perf_counter()


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
    assert len(waits) == 2 and min(waits) > INPUT_BOUND, waits  # about 5/6 of each epoch
    out = capsys.readouterr().out
    assert f"the devices waited for input {waits[0]:.0%} of epoch 1 (" in out, out
    assert "docs/performance.md#am-i-input-bound" in out
    assert "of epoch 2" not in out  # said once, after the first epoch


def test_input_from_the_device_cache_is_not_waited_for(capsys):
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer=optax.sgd(0.1), steps_per_execution=1)
    history = trainer.fit(ef.data.Arrays(x, y, scale=1 / 255), epochs=3, batch_size=50, verbose=2, cache=True)
    # the first epoch streams while it records; later ones gather on the device: no input
    assert history.history["input_wait"][1:] == [0.0, 0.0], history.history["input_wait"]
    assert "waited for input" not in capsys.readouterr().out
