"""Loads a checkpoint into another model, once caught (``trainer.load``), then uncaught
(``Trainer.from_checkpoint``): the program ends with the CheckpointError's traceback alone.

    python wrong_model_load.py CHECKPOINT_DIR
"""

import sys

import numpy as np
from flax import linen as nn

import easyfit as ef
from tests.helpers.models import TinyMLP


class Narrower(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(8)(x.reshape((x.shape[0], -1)))))


x, y = np.zeros((8, 4, 4, 1), np.float32), np.arange(8) % 10
trainer = ef.Trainer(TinyMLP())
trainer.fit(x, y, batch_size=4, verbose=0)
path = trainer.save(sys.argv[1])
other = ef.Trainer(Narrower())
other.fit(x, y, batch_size=4, verbose=0)
try:
    other.load(path)
except ef.CheckpointError as e:
    print("caught:", e, flush=True)
ef.Trainer.from_checkpoint(path, Narrower())
