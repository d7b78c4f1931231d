"""Two identical fits with ``Trainer(deterministic=...)``, for tests/test_deterministic.py.

    python deterministic_fit.py DATA_DIR OUT_NPZ true|false

Creates each Trainer before anything uses JAX, trains a conv + BatchNorm model 1 epoch on a
200-image MNIST sample folder (written on the first run, reused after) over every CPU device,
and saves both runs' parameters and batch statistics to OUT_NPZ. Prints one JSON line: the
XLA_FLAGS the backend started with and the warnings about determinism given.
"""

import json
import os
import sys
import warnings

import numpy as np

import easyfit as ef
from tests.helpers import flat_params
from tests.helpers.models import NormedCNN

data_dir, out, flag = sys.argv[1], sys.argv[2], sys.argv[3] == "true"
runs = []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
        with ef.Trainer(NormedCNN(), optimizer="adam", seed=0, deterministic=flag) as trainer:
            root = ef.datasets.sample_folder(data_dir, limit=(200, 100))
            trainer.fit(root, epochs=1, batch_size=50, verbose=0)
            runs.append(flat_params((trainer.state.params, trainer.state.model_state)))
np.savez(out, first=runs[0], second=runs[1])
ours = [str(w.message) for w in caught if "deterministic" in str(w.message)]
print(json.dumps({"xla_flags": os.environ.get("XLA_FLAGS", ""), "warnings": ours}))
