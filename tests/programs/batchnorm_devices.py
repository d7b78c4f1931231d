"""Trains a small CNN with BatchNorm on the packaged sample on every (virtual) device; writes the
trained parameters and batch statistics to OUT.npz.

    python batchnorm_devices.py OUT.npz
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
trainer = ef.Trainer(NormedCNN(), optimizer=optax.sgd(0.05, momentum=0.9), seed=0, steps_per_execution=1)
trainer.fit(ef.data.Arrays(x[:800], y[:800], scale=1 / 255), epochs=1, batch_size=80, verbose=0, cache=False)
state = jax.device_get({"params": trainer.state.params, "stats": trainer.state.model_state})
leaves = jax.tree_util.tree_leaves_with_path(state)
np.savez(sys.argv[1], **{jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves})
print(jax.device_count())
