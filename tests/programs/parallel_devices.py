"""Trains the small MLP on an image folder as tests/programs/train_devices.py does, on 1, 4 and 8
of the process's (virtual) devices in turn (``Trainer(devices=...)``: a mesh of that many), on 4
with 4 steps per dispatch, and asks 8 for a batch of 100; prints one JSON line of figures per
run, keyed by run, and writes each run's trained parameters to OUT/<run>.npz.

    python parallel_devices.py ROOT OUT   (with at least 8 devices)
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from tests.programs.train_devices import fit_figures  # noqa: E402

root, out = sys.argv[1], Path(sys.argv[2])


results = {str(n): fit_figures(root, n) for n in (1, 4, 8)}
results["4-k4"] = fit_figures(root, 4, steps_per_execution=4)
results["8-batch-100"] = fit_figures(root, 8, batch_size=100)
for name, r in results.items():
    if "params" in r:
        np.savez(out / f"{name}.npz", *r.pop("params"))
print(json.dumps({"process_devices": jax.device_count(), **results}))
