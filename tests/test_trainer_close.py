"""Trainer.close() and ``with ef.Trainer(...) as t:`` release what a trainer keeps between
passes: DALI pipelines, the device cache, open files, compiled steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import easyfit as ef

# Each trainer fits one epoch (validation included, from the device cache), evaluates and
# predicts, then is closed and dropped. After 10 (JAX's and DALI's one-time allocations), the
# next 10 may add at most 4 MiB of RSS each on average and no thread. Measured on CPU: about
# +15 MiB for the 10 with close(), +50 to +100 MiB without it.
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
    for seed in range(20):
        once(seed)
        if seed in (9, 19):
            gc.collect()
            marks.append((rss_mib(), len(os.listdir("/proc/self/task"))))
    print(json.dumps(marks))
""")


@pytest.mark.slow
def test_twenty_trainers_closed_leave_memory_and_threads_flat():
    proc = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "XLA_FLAGS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rss_10, threads_10), (rss_20, threads_20) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rss_20 - rss_10 < 10 * 4.0, (rss_10, rss_20)
    assert threads_20 <= threads_10, (threads_10, threads_20)


def test_close_releases_kept_loaders_and_the_trainer_works_on():
    x = np.random.default_rng(0).integers(0, 255, (64, 4, 4, 1), dtype=np.uint8)
    y = np.arange(64) % 10
    from flax import linen as nn

    model = nn.Sequential([lambda v: v.reshape((v.shape[0], -1)), nn.Dense(10)])
    with ef.Trainer(model, seed=0) as trainer:
        trainer.fit(x, y, epochs=1, batch_size=16, validation_data=(x, y), verbose=0)
        kept = trainer._data._passes._loaders  # noqa: SLF001 - what close must empty
        assert kept
        before = trainer.evaluate(x, y)
    assert not kept and not trainer._compiled  # noqa: SLF001
    assert trainer.evaluate(x, y) == pytest.approx(before)  # rebuilds what it needs
    trainer.close()
