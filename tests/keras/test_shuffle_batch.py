"""``fit(shuffle="batch")`` as Keras' array adapter has it: the batches of the data's own
order, each batch's samples permuted afresh every epoch; checked on the samples each step
trains on."""

from __future__ import annotations

import os

import numpy as np
import optax
import pytest

import easyfit as ef
from tests.helpers.models import SmallMLP
from tests.helpers.stream import Recorder, fit_indexed


def test_each_batch_holds_the_same_samples_permuted_afresh_every_epoch():
    """keras: array_data_adapter_test.py::test_basic_flow (shuffle="batch": a batch holds
    consecutive samples, in a permuted order)."""
    trainer = Recorder(SmallMLP(), optimizer=optax.adam(1e-2), seed=0, steps_per_execution=1)
    fit_indexed(trainer, 10, 4, 3, None, shuffle="batch")
    trainer.stream()
    steps = [s.tolist() for s in trainer.seen]
    assert [sorted(s) for s in steps] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] * 3
    epochs = [sum(steps[e * 3 : e * 3 + 3], []) for e in range(3)]
    assert epochs[0] != list(range(10)) or epochs[1] != list(range(10))  # permuted within
    assert len({tuple(e) for e in epochs}) > 1  # afresh each epoch


def test_other_values_are_refused():
    trainer = ef.Trainer(SmallMLP(), optimizer="adam")
    with pytest.raises(ValueError, match=r"shuffle='global': expected True, False or 'batch'"):
        trainer.fit(np.zeros((4, 2), np.float32), np.zeros(4, np.int32), shuffle="global", verbose=0)


def test_a_reader_driven_source_refuses_it_unless_cached(format_roots):
    lmdb = os.path.join(format_roots["lmdb"], "train")
    trainer = ef.Trainer(SmallMLP(), optimizer="adam")
    with pytest.raises(ValueError, match="shuffle='batch': this source is read by DALI's reader"):
        trainer.fit(lmdb, shuffle="batch", cache=False, epochs=1, batch_size=100, verbose=0)
