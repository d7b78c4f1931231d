"""Trains a small CNN with BatchNorm on the packaged sample on the first 1 and the first 4 of the
process's (virtual) devices (``Trainer(devices=...)``: a mesh of that many); writes each fit's
trained parameters and batch statistics to OUT-<devices>.npz.

    python batchnorm_devices.py OUT   (with at least 4 devices)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import easyfit as ef  # noqa: E402
from tests.helpers.models import NormedCNN  # noqa: E402

(x, y) = ef.datasets.sample()["train"]
for n in (1, 4):
    trainer = ef.Trainer(
        NormedCNN(),
        optimizer=optax.sgd(0.05, momentum=0.9),
        seed=0,
        steps_per_execution=1,
        devices=jax.devices()[:n],
    )
    trainer.fit(
        ef.data.Arrays(x[:800], y[:800], scale=1 / 255), epochs=1, batch_size=80, verbose=0, cache=False
    )
    state = jax.device_get({"params": trainer.state.params, "stats": trainer.state.model_state})
    leaves = jax.tree_util.tree_leaves_with_path(state)
    np.savez(f"{sys.argv[1]}-{n}.npz", **{jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves})
    print(len(trainer.state.step.sharding.device_set))
