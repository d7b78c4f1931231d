"""ModelCheckpoint(max_to_keep=N): the disk does not grow without bound, and nothing the
callback did not write is deleted."""

from __future__ import annotations

import os

import optax
import pytest

import easyfit as ef
from easyfit.callbacks import ModelCheckpoint
from tests.helpers.models import SmallMLP


def test_max_to_keep_keeps_the_newest_and_nothing_else_is_touched(tmp_path):
    (x, y) = ef.datasets.sample()["train"]
    os.makedirs(tmp_path / "ckpt" / "mine")  # the user's own folder beside the checkpoints
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3))
    keep = ModelCheckpoint(str(tmp_path / "ckpt" / "ep-{epoch}"), max_to_keep=2)
    trainer.fit(
        ef.data.Arrays(x[:400], y[:400], scale=1 / 255), epochs=4, batch_size=100, verbose=0, callbacks=[keep]
    )
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["ep-3", "ep-4", "mine"]
    again = ef.Trainer.from_checkpoint(tmp_path / "ckpt" / "ep-4", SmallMLP(), optimizer=optax.adam(1e-3))
    assert int(again.state.step) == 16


def test_max_to_keep_is_checked():
    with pytest.raises(ValueError, match="max_to_keep=0"):
        ModelCheckpoint("ckpt", max_to_keep=0)
