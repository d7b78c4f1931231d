"""The core path: fit / evaluate / predict on real MNIST images through DALI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import optax
import pytest

import easyfit as ef
from tests.helpers import flat_params
from tests.helpers.models import NNXMLP, SmallMLP


def _trainer(**kw):
    kw.setdefault("optimizer", optax.sgd(0.1, momentum=0.9))
    return ef.Trainer(SmallMLP(), seed=kw.pop("seed", 0), **kw)


def test_fit_trains_and_validates_from_a_split_folder(mnist_dir):
    trainer = _trainer(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = trainer.fit(mnist_dir, epochs=3, batch_size=100, verbose=0)
    assert history is trainer.history
    assert history.epoch == [0, 1, 2]
    assert set(history.history) == {"loss", "accuracy", "input_wait", "val_loss", "val_accuracy"}
    assert all(len(v) == 3 for v in history.history.values())
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["val_accuracy"][-1] > 0.85
    assert trainer.class_names == [str(d) for d in range(10)]


def test_defaults_only(mnist_dir):
    trainer = ef.Trainer(SmallMLP())
    history = trainer.fit(mnist_dir, epochs=1, verbose=0)
    assert trainer.batch_size == 32 and trainer.loss == "sparse_categorical_crossentropy"
    assert set(history.history) == {"loss", "accuracy", "input_wait", "val_loss", "val_accuracy"}
    assert history.history["val_accuracy"][0] > 0.8


def test_same_seed_same_parameters_bit_for_bit(mnist_dir):
    runs = []
    for seed in (3, 3, 4):
        trainer = _trainer(seed=seed)
        trainer.fit(mnist_dir + "/train", epochs=1, batch_size=100, verbose=0)
        runs.append(flat_params(trainer.params))
    assert np.array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])


def test_evaluate_and_predict_count_every_sample_once(mnist_dir):
    trainer = _trainer()
    trainer.fit(mnist_dir + "/train", epochs=1, batch_size=64, verbose=0)
    val = ef.data.ImageFolder(mnist_dir + "/val")
    for batch_size in (64, 7 * 13, 500, 512):  # remainders of 52, 45, 0, and one padded batch
        result = trainer.evaluate(val, batch_size=batch_size)
        predictions = trainer.predict(val, batch_size=batch_size)
        assert predictions.shape == (500, 10)
        expected = np.mean(predictions.argmax(-1) == val.labels)
        assert result["accuracy"] == pytest.approx(expected, abs=1e-6)
        assert set(result) == {"loss", "accuracy"}


def test_predict_rows_follow_the_file_order(mnist_dir, mnist_arrays):
    trainer = _trainer()
    trainer.fit(mnist_dir + "/train", epochs=1, batch_size=100, verbose=0)
    val = ef.data.ImageFolder(mnist_dir + "/val")
    predictions = trainer.predict(val, batch_size=96)
    x_val, _ = mnist_arrays["val"]
    index = [int(os.path.basename(f).split(".")[0]) for f in val.files]
    direct = SmallMLP().apply(
        {"params": jax.device_get(trainer.params)}, x_val[index].astype(np.float32) / 255.0
    )
    np.testing.assert_allclose(predictions, np.asarray(direct), rtol=1e-4, atol=1e-4)


def epoch_samples(source, batch_size, epochs, steps_per_execution=1, shuffle=True, pipelines=None):
    """Sample ids (x holds each sample's index) the real loader delivers, per epoch."""
    from easyfit.data.loader import Loader
    from easyfit.parallel import Placement

    placement = Placement.create()
    plan = ef.data.Plan(
        len(source),
        batch_size,
        shuffle=shuffle,
        seed=0,
        steps_per_execution=steps_per_execution,
        num_shards=placement.num_shards,
    )
    loader = Loader(
        source, plan, placement, pipelines_per_device=pipelines, threaded=pipelines is not None
    )  # as on GPUs: a thread per pipeline
    seen = []
    for _ in range(epochs):
        ids = []
        for _ in range(plan.chunks_per_epoch):
            chunk = next(loader)
            x, mask = np.asarray(chunk["x"]).ravel(), np.asarray(chunk["mask"])
            ids.append(x[mask].astype(int))
        seen.append(np.concatenate(ids))
    loader.close()
    return seen


def test_loader_shuffles_the_whole_dataset_every_epoch():
    n = 1000
    y = (np.arange(n) // 100).astype(np.int32)  # sorted classes, like class folders
    source = ef.data.Arrays(np.arange(n, dtype=np.float32)[:, None], y)
    for batch_size, k in ((100, 1), (96, 4)):  # with and without a padded last chunk
        epochs = epoch_samples(source, batch_size, epochs=2, steps_per_execution=k)
        for ids in epochs:
            assert sorted(ids.tolist()) == list(range(n))  # each sample exactly once
        assert len(set(y[epochs[0][:batch_size]])) == 10  # a 1k buffer would give 1 or 2 classes
        assert not np.array_equal(epochs[0], epochs[1])
    again = epoch_samples(source, 96, epochs=1, steps_per_execution=4)
    assert np.array_equal(again[0], epochs[0])  # a function of (seed, epoch) alone
    ordered = epoch_samples(source, 96, epochs=1, shuffle=False)
    assert ordered[0].tolist() == list(range(n))
    split = epoch_samples(source, 96, epochs=2, steps_per_execution=4, pipelines=3)
    assert all(np.array_equal(a, b) for a, b in zip(split, epochs, strict=True))  # rows joined


def test_validation_data_overrides_the_folder(mnist_dir, mnist_arrays):
    x, y = mnist_arrays["val"]
    trainer = _trainer()
    history = trainer.fit(mnist_dir, epochs=1, batch_size=100, verbose=0, validation_data=(x[:300], y[:300]))
    again = trainer.evaluate(x[:300], y[:300])  # the same arrays, the same final parameters
    assert again["accuracy"] == history.history["val_accuracy"][0]
    assert again["loss"] == history.history["val_loss"][0]
    # (x, y) arrays are not scaled (Keras semantics); a folder's images are in [0, 1]:
    scaled = trainer.evaluate(ef.data.Arrays(x[:300], y[:300], scale=1 / 255))
    folder = trainer.evaluate(mnist_dir + "/val")
    assert abs(scaled["accuracy"] - folder["accuracy"]) < 0.1


def test_nnx_module_trains_through_the_same_trainer(mnist_dir):
    from flax import nnx

    model = NNXMLP(nnx.Rngs(0))
    trainer = ef.Trainer(model, optimizer=optax.sgd(0.1, momentum=0.9))
    history = trainer.fit(mnist_dir, epochs=2, batch_size=100, verbose=0)
    assert history.history["val_accuracy"][-1] > 0.85
    assert isinstance(trainer.params, nnx.State)
    trained = trainer.model
    logits = trained(np.zeros((2, 28, 28, 1), np.float32))
    assert logits.shape == (2, 10)


def test_progress_verbose_levels(mnist_dir, capsys):
    _trainer().fit(mnist_dir, epochs=2, batch_size=100, verbose=0)
    assert capsys.readouterr().out == ""
    _trainer().fit(mnist_dir, epochs=2, batch_size=100, verbose=1)  # stdout is not a terminal
    note, loss, *lines = capsys.readouterr().out.strip().splitlines()
    assert note.startswith("easyfit: caching the decoded dataset")  # what cache="auto" chose
    assert loss == (
        "easyfit: loss='sparse_categorical_crossentropy' (none given; integer labels, read as class indices)"
    )  # the loss the labels chose
    assert [ln.split(" - ")[0] for ln in lines] == ["Epoch 1/2", "Epoch 2/2"]
    assert "val_accuracy:" in lines[-1]


def test_each_step_function_compiles_once(mnist_arrays):
    x, y = mnist_arrays["train"]
    trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1), steps_per_execution=3)
    # 1000 samples at batch 96: 11 steps, 4 chunks, the last one padded and masked
    trainer.fit(
        x[:1000],
        y[:1000],
        batch_size=96,
        epochs=2,
        verbose=0,
        validation_data=(x[1000:1500], y[1000:1500]),
        cache=False,
    )
    trainer.evaluate(x[1000:1500], y[1000:1500], batch_size=96)
    (fns,) = trainer._steps.configurations()
    assert fns.train(3)._cache_size() == 1  # not again for the second chunk or epoch
    assert fns.train(2)._cache_size() == 1  # the last chunk: 11 steps = 3 + 3 + 3 + 2
    assert fns.eval._cache_size() == 1


# Each trainer fits one epoch (validation included, from the device cache), evaluates and
# predicts, then is closed and dropped. After 20 (JAX's and DALI's one-time allocations, and
# JAX's caches and the allocator settling: 41.8, 22.2, 14.7, 16.6 MiB per ten over fifty), the
# next 10 may add at most 4 MiB of RSS each on average and no thread. Measured on CPU: about
# +15 MiB for ten with close(), +50 to +100 MiB without it.
_PROGRAM = textwrap.dedent("""
    import gc, json, os, sys, tempfile
    import easyfit as ef
    from flax import linen as nn

    root = ef.datasets.sample_folder(tempfile.mkdtemp() + "/sample", limit=(200, 100))

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def once(seed):
        model = nn.Sequential([lambda x: x.reshape((x.shape[0], -1)), nn.Dense(10)])
        with ef.Trainer(model, seed=seed) as trainer:
            trainer.fit(root, epochs=1, batch_size=50, verbose=0)
            trainer.evaluate(root + "/val")
            trainer.predict(root + "/val")

    marks = []
    for seed in range(30):  # JAX's caches and the allocator settle over the first 20
        once(seed)
        if seed in (19, 29):
            gc.collect()
            marks.append((rss_mib(), len(os.listdir("/proc/self/task"))))
    print(json.dumps(marks))
""")


@pytest.mark.slow
def test_ten_trainers_closed_after_twenty_leave_memory_and_threads_flat():
    proc = subprocess.run(
        [sys.executable, "-c", _PROGRAM],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "XLA_FLAGS": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rss_20, threads_20), (rss_30, threads_30) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rss_30 - rss_20 < 10 * 4.0, (rss_20, rss_30)  # under 4 MiB a trainer
    assert threads_30 <= threads_20, (threads_20, threads_30)


def test_close_releases_kept_loaders_and_the_trainer_works_on():
    x = np.random.default_rng(0).integers(0, 255, (64, 4, 4, 1), dtype=np.uint8)
    y = np.arange(64) % 10
    from flax import linen as nn

    model = nn.Sequential([lambda v: v.reshape((v.shape[0], -1)), nn.Dense(10)])
    with ef.Trainer(model, seed=0) as trainer:
        trainer.fit(x, y, epochs=1, batch_size=16, validation_data=(x, y), verbose=0)
        kept = trainer._data._kept._streams  # noqa: SLF001 - what close must empty
        assert kept
        before = trainer.evaluate(x, y)
    assert not kept and not trainer._steps.configurations()  # noqa: SLF001
    assert trainer.evaluate(x, y) == pytest.approx(before)  # rebuilds what it needs
    trainer.close()
