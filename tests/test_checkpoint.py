"""Orbax checkpoints: Trainer.save / load / from_checkpoint, and ModelCheckpoint."""

from __future__ import annotations

import os

import jax
import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.callbacks import LambdaCallback, ModelCheckpoint
from tests.helpers import flat_params, run_program
from tests.helpers.models import NNXMLP, SmallMLP


@pytest.fixture(scope="module")
def data(mnist_arrays):
    (x, y), (xv, yv) = mnist_arrays["train"], mnist_arrays["val"]
    return ef.data.Arrays(x[:600], y[:600], scale=1 / 255), (xv[:200], yv[:200])


def _trainer(**kw):
    kw.setdefault("steps_per_execution", 1)  # batch hooks at every step
    return ef.Trainer(SmallMLP(), optimizer=optax.adam(1e-3), seed=2, **kw)


def _fit(trainer, data, callbacks=(), epochs=2, initial_epoch=0):
    train, val = data
    return trainer.fit(
        train,
        epochs=epochs,
        batch_size=100,
        verbose=0,
        validation_data=val,
        callbacks=list(callbacks),
        initial_epoch=initial_epoch,
    )


def _keep_params(trainer, into):
    return LambdaCallback(
        on_epoch_end=lambda epoch, logs: into.append(flat_params(jax.device_get(trainer.params)))
    )


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    """One fit of 3 epochs (6 batches each) with several ModelCheckpoints."""
    root = tmp_path_factory.mktemp("checkpoints")
    trainer, seen = _trainer(), []
    callbacks = [
        _keep_params(trainer, seen),
        ModelCheckpoint(str(root / "named" / "ckpt-{epoch:02d}-{val_loss:.4f}")),
        ModelCheckpoint(
            root / "best", monitor="loss", mode="max", save_best_only=True, save_weights_only=True
        ),  # the loss falls: only epoch 1 is "best"
        ModelCheckpoint(root / "latest"),  # the same path every epoch
        ModelCheckpoint(root / "batches" / "e{epoch}-b{batch}", save_freq=4),
    ]
    history = _fit(trainer, data, callbacks, epochs=3)
    return trainer, root, seen, history


def _load(path):
    return ef.Trainer.from_checkpoint(path, SmallMLP(), optimizer=optax.adam(1e-3))


def test_save_then_from_checkpoint_goes_on_exactly(tmp_path, data):
    first = _trainer()
    _fit(first, data, epochs=1)
    path = first.save(tmp_path / "ckpt")
    meta = ef.checkpoint.read_metadata(path)
    assert (meta["epoch"], meta["step"], meta["kind"]) == (1, 6, "full")
    second = _load(path)
    assert second.seed == 2  # the seed (the data order) comes with the checkpoint
    for a, b in zip(
        jax.tree_util.tree_leaves(first.state), jax.tree_util.tree_leaves(second.state), strict=True
    ):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    _fit(first, data, epochs=2, initial_epoch=1)
    _fit(second, data, epochs=2, initial_epoch=meta["epoch"])
    assert np.array_equal(flat_params(second.params), flat_params(first.params))


def test_load_refuses_what_is_not_a_complete_checkpoint(tmp_path):
    trainer = _trainer()
    with pytest.raises(ef.CheckpointError, match="no such checkpoint"):
        trainer.load(tmp_path / "missing")
    unfinished = tmp_path / "ckpt.orbax-checkpoint-tmp-1700000000"
    os.makedirs(unfinished / "state")
    with pytest.raises(ef.CheckpointError, match="unfinished checkpoint"):
        trainer.load(unfinished)
    os.makedirs(tmp_path / "other")
    with pytest.raises(ef.CheckpointError, match="not an easyfit checkpoint"):
        trainer.load(tmp_path / "other")


def test_the_resume_helpers_of_easyfit_checkpoint_still_work_for_a_release_with_a_warning():
    """``find_resume_point`` and ``fit_completed`` belong to fit's resume protocol
    (``Resumable``): no longer public, they keep working, warning at the caller's line and
    naming what to use instead."""

    class Resumes:
        done = False

        def restore_point(self):
            return "point"

        def fit_completed(self):
            self.done = True

    cb = Resumes()
    old = r"find_resume_point is deprecated.*cb\.restore_point\(\)"
    with pytest.warns(DeprecationWarning, match=old) as w:
        assert ef.checkpoint.find_resume_point([object(), cb]) == "point"
    assert w[0].filename == __file__
    with pytest.warns(DeprecationWarning, match=r"fit_completed is deprecated.*cb\.fit_completed\(\)"):
        ef.checkpoint.fit_completed([object(), cb])
    assert cb.done
    assert not {"find_resume_point", "fit_completed"} & set(ef.checkpoint.__all__)


@pytest.mark.slow
def test_a_checkpoint_of_another_model_fails_with_its_traceback_alone(tmp_path):
    # a fresh interpreter: what Orbax's reads leave behind shows at exit, on stderr
    proc = run_program("wrong_model_load.py", str(tmp_path / "ckpt"), timeout=300)
    why = (
        "item 'state' was saved from another model: "
        "params/Dense_0/kernel has shape (16, 10) in the checkpoint, (8, 10)"
    )
    assert proc.returncode == 1 and f"caught: {tmp_path / 'ckpt'}: {why}" in proc.stdout, proc.stderr
    lines = proc.stderr.rstrip("\n").splitlines()
    assert lines[0] == "Traceback (most recent call last):", proc.stderr
    assert lines[-1].startswith(f"easyfit.errors.CheckpointError: {tmp_path / 'ckpt'}: {why}"), proc.stderr
    assert proc.stderr.count("Traceback") == 1 and not any(
        line.startswith(("Exception ignored", "WARNING", "E0", "W0")) for line in lines
    ), proc.stderr


def test_model_checkpoint_every_epoch_with_metrics_in_the_name(run):
    _, root, seen, history = run
    names = sorted(os.listdir(root / "named"))
    assert names == [f"ckpt-{e + 1:02d}-{v:.4f}" for e, v in enumerate(history.history["val_loss"])]
    for name, params in zip(names, seen, strict=True):
        assert np.array_equal(flat_params(_load(root / "named" / name).params), params)


def test_model_checkpoint_best_only_weights_only_and_overwrite(run):
    _, root, seen, _ = run
    assert sorted(os.listdir(root)) == ["batches", "best", "latest", "named"]  # no leftovers
    meta = ef.checkpoint.read_metadata(root / "best")
    assert meta["kind"] == "weights" and meta["step"] == 6
    fresh = _trainer()
    fresh.load(root / "best")
    assert np.array_equal(flat_params(fresh.params), seen[0])
    assert int(fresh.state.step) == 0  # weights only: the optimizer state is not restored
    fresh.load(root / "latest")
    assert np.array_equal(flat_params(fresh.params), seen[-1]) and int(fresh.state.step) == 18


def test_model_checkpoint_every_n_batches(run, data):
    trainer, root, _, _ = run
    assert sorted(os.listdir(root / "batches")) == ["e1-b4", "e2-b2", "e2-b6", "e3-b4"]
    meta = ef.checkpoint.read_metadata(root / "batches" / "e2-b2")
    assert (meta["epoch"], meta["batch"], meta["step"], meta["has_metrics"]) == (1, 2, 8, True)
    with pytest.raises(ValueError, match="names 'val_auc'"):
        _fit(trainer, data, [ModelCheckpoint(root / "{val_auc}")], epochs=1)


def test_nnx_model_round_trip(tmp_path, data):
    from flax import nnx

    trainer = ef.Trainer(NNXMLP(nnx.Rngs(0)), optimizer=optax.adam(1e-3))
    _fit(trainer, data, epochs=1)
    path = trainer.save(tmp_path / "nnx")
    again = ef.Trainer.from_checkpoint(path, NNXMLP(nnx.Rngs(5)), optimizer=optax.adam(1e-3))
    assert np.array_equal(flat_params(again.params), flat_params(trainer.params))
    x = np.asarray(data[1][0][:4], np.float32) / 255
    np.testing.assert_array_equal(np.asarray(again.model(x)), np.asarray(trainer.model(x)))
