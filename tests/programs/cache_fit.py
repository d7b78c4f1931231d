"""One small fit, counting JAX's persistent compilation cache hits, for the cache tests.

    python cache_fit.py DATA_DIR

Trains 1 epoch of a SmallMLP on a 200-image MNIST sample folder (written on the first run,
reused after) and prints one JSON line: the cache folder JAX used and the hits it counted.
"""

import json
import sys

import jax

import easyfit as ef
from tests.helpers.models import SmallMLP

hits = []
jax.monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
)
root = ef.datasets.sample_folder(sys.argv[1], limit=(200, 100))
with ef.Trainer(SmallMLP(), optimizer="sgd", seed=0) as trainer:
    trainer.fit(root, epochs=1, batch_size=50, verbose=0)
print(json.dumps({"folder": jax.config.jax_compilation_cache_dir, "hits": len(hits)}))
