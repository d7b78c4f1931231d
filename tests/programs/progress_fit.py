"""A small fit with the default progress display, for tests that read what it shows.

    python progress_fit.py DATA_DIR HISTORY_JSON

Trains 2 epochs on a small MNIST sample folder with validation and three metrics (long epoch
lines), and writes History.history to HISTORY_JSON (not to the screen the test reads).
"""

import json
import sys

import easyfit as ef
from tests.helpers.models import SmallMLP

data_dir, out = sys.argv[1:3]
root = ef.datasets.sample_folder(data_dir, limit=(200, 100))
metrics = ["accuracy", "sparse_top_k_categorical_accuracy"]
with ef.Trainer(SmallMLP(), optimizer="adam", metrics=metrics, seed=0) as trainer:
    history = trainer.fit(root, epochs=2, batch_size=20)
with open(out, "w") as f:
    json.dump(history.history, f)
