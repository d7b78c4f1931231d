"""A fit that fails on its labels while its training step still compiles, caught, then exit.

    python data_error_exit.py DATA_DIR LOOP

A model of 5 outputs on 10 classes: fit raises DataError after the first batch, while the
training step (slow to compile: an unrolled loop) compiles in the background. The program
catches the error and ends; it must exit with status 0.
"""

import sys

import jax
import jax.numpy as jnp
from flax import linen as nn

import easyfit as ef


class SlowToCompile(nn.Module):
    """Quick to initialise; its training step (an unrolled loop) takes seconds to compile."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dense(16)(x.reshape((x.shape[0], -1)))
        if train:
            x = jax.lax.fori_loop(0, int(sys.argv[2]), lambda i, h: jnp.tanh(h * 1.01 + 0.1), x, unroll=True)
        return nn.Dense(5)(x)


root = ef.datasets.sample_folder(sys.argv[1], limit=(100, 20))
trainer = ef.Trainer(SlowToCompile(), optimizer="adam")
try:
    trainer.fit(root, epochs=1, batch_size=50, verbose=0)
except ef.errors.DataError as e:
    print("DataError:", e, flush=True)
