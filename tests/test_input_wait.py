"""Am I input-bound? fit measures the share of each epoch the devices waited for input, logs it
as ``input_wait`` and, after the first epoch whose input comes as in later ones, says so when it
is large, on a line of its own under that epoch's metrics, with the docs site's address."""

from __future__ import annotations

import time

import optax
from flax import linen as nn

import easyfit as ef
from easyfit._links import docs_url
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
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Epoch 1/2 - "))
    notice = lines[at + 1]  # under the epoch's metrics line, a line of its own
    assert notice.startswith(f"easyfit: the devices waited for input {waits[0]:.0%} of epoch 1 ("), out
    assert notice.endswith("training is input-bound; see " + docs_url("performance.md#am-i-input-bound"))
    assert lines[at + 2].startswith("Epoch 2/2 - ") and "of epoch 2" not in out  # said once


def test_input_from_the_device_cache_is_not_waited_for(capsys):
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer=optax.sgd(0.1), steps_per_execution=1)
    history = trainer.fit(SlowArrays(x, y, scale=1 / 255), epochs=3, batch_size=50, verbose=2, cache=True)
    # the first epoch streams (from the slow source) while it records; later ones gather on the
    # device: no input. The notice judges the second, so says nothing. (The first epoch's share
    # is diluted by compiling and recording, so it is only asked to be clearly above zero.)
    waits = history.history["input_wait"]
    assert waits[0] > 0.05 and waits[1:] == [0.0, 0.0], waits
    assert "waited for input" not in capsys.readouterr().out
