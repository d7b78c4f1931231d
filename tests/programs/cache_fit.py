"""One small fit, counting JAX's persistent compilation cache hits, for the cache tests.

    python cache_fit.py DATA_DIR

Trains 1 epoch of a SmallMLP on a 200-image MNIST sample folder (written on the first run,
reused after) and prints one JSON line: the cache folder JAX used, the hits it counted, and
whether the initial state was read from easyfit's kept states (its log line).
"""

import json
import logging
import sys

import jax

import easyfit as ef
from tests.helpers.models import SmallMLP

hits = []
jax.monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
)
read: list[str] = []
handler = logging.Handler()
handler.emit = lambda record: read.append(record.getMessage())  # type: ignore[method-assign]
logging.getLogger("easyfit").addHandler(handler)
logging.getLogger("easyfit").setLevel(logging.INFO)
root = ef.datasets.sample_folder(sys.argv[1], limit=(200, 100))
with ef.Trainer(SmallMLP(), optimizer="sgd", seed=0) as trainer:
    trainer.fit(root, epochs=1, batch_size=50, verbose=0)
state_read = any(m.startswith("easyfit: initial state read from") for m in read)
folder = jax.config.jax_compilation_cache_dir
print(json.dumps({"folder": folder, "hits": len(hits), "state_read": state_read}))
