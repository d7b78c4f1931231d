"""Trains a small CNN with BatchNorm on the packaged sample on every (virtual) device; writes the
trained parameters and batch statistics to OUT.npz.

    python batchnorm_devices.py OUT.npz
"""

import sys

import jax
import numpy as np
import optax
from flax import linen as nn

import easyfit as ef


class NormedCNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(8, (3, 3), strides=(2, 2))(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
        return nn.Dense(10)(x.reshape((x.shape[0], -1)))


(x, y) = ef.datasets.sample()["train"]
trainer = ef.Trainer(NormedCNN(), optimizer=optax.sgd(0.05, momentum=0.9), seed=0,
                     steps_per_execution=1)
trainer.fit(ef.data.Arrays(x[:800], y[:800], scale=1 / 255), epochs=1, batch_size=80, verbose=0,
            cache=False)
state = jax.device_get({"params": trainer.state.params, "stats": trainer.state.model_state})
leaves = jax.tree_util.tree_leaves_with_path(state)
np.savez(sys.argv[1], **{jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves})
print(jax.device_count())
