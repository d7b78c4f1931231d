"""Runs tests/helpers/structured.py (structured batches, per-output losses, sample weights, a
custom train_step) on every (virtual) device; prints its results as JSON.

    python structured_devices.py
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.helpers.structured import run_all  # noqa: E402

print(json.dumps(run_all()))
