"""fit(steps_per_epoch=...) on every (virtual) device: the stream of samples trained on, a
resume mid-epoch, and a DALI reader's stream; prints JSON figures.

    python steps_per_epoch_devices.py BACKUP_DIR LMDB_ROOT
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import easyfit as ef  # noqa: E402
from easyfit.data.loader import Loader  # noqa: E402
from easyfit.parallel import Placement  # noqa: E402
from tests.helpers import Crash, crash_at, flat_params  # noqa: E402
from tests.helpers.models import SmallMLP  # noqa: E402
from tests.helpers.stream import Recorder, fit_indexed, passes  # noqa: E402

backup, lmdb = sys.argv[1], sys.argv[2]
N, B, SEED = 10, 4, 0
result: dict = {"devices": jax.device_count()}


def trainer(k):
    return Recorder(SmallMLP(), optimizer=optax.adam(1e-2), seed=SEED, steps_per_execution=k)


def fit(t, epochs, steps_per_epoch, callbacks=()):
    return fit_indexed(t, N, B, epochs, steps_per_epoch, callbacks)


result["streams"] = {}
for steps_per_epoch, k in ((2, 1), (5, 2)):
    t = trainer(k)
    fit(t, 3, steps_per_epoch)
    seen = t.stream()
    result["streams"][f"{steps_per_epoch}-{k}"] = bool(
        len(t.seen) == 3 * steps_per_epoch and np.array_equal(seen, passes(N, SEED, 6)[: len(seen)])
    )

reference = trainer(2)
fit(reference, 3, 5)
crashing = trainer(2)
try:
    fit(crashing, 3, 5, [ef.callbacks.BackupAndRestore(backup, save_freq=2), crash_at(crashing, 1, 1)])
except Crash:
    pass
point = ef.callbacks.BackupAndRestore(backup).restore_point()
result["resumed_point"] = [point.epoch, point.batch]
resumed = trainer(2)
result["resumed_epochs"] = fit(resumed, 3, 5, [ef.callbacks.BackupAndRestore(backup, save_freq=2)]).epoch
result["resumed_identical"] = bool(np.array_equal(flat_params(resumed.params), flat_params(reference.params)))

# a DALI reader (one pipeline for the 4 devices): epochs of steps_per_epoch steps read on through
# the reader's passes: the labels of a plain stream, in the same order
source = ef.data.Caffe2LMDB(lmdb + "/train")
placement = Placement.create()


def labels(k, steps_per_epoch, chunks):
    """The valid labels of the first ``chunks`` chunks of a training loader."""
    plan = ef.data.Plan(
        len(source), 100, seed=SEED, steps_per_execution=k, num_shards=4, epoch_steps=steps_per_epoch
    )
    loader = Loader(source, plan, placement)
    out = []
    for _ in range(chunks):
        chunk = next(loader)  # shard-major rows -> step-major (see Plan.chunk)
        y, mask = (np.asarray(chunk[key]).reshape(4, k, -1).swapaxes(0, 1).ravel() for key in ("y", "mask"))
        out.append(y[mask])
    loader.close()
    return np.concatenate(out)


plain = labels(1, None, 30)  # 3 passes of 10 steps
result["reader_streams"] = {}
# (k, steps_per_epoch, chunks read, samples in them): 12 steps; 2 epochs of 13 steps
for k, steps_per_epoch, chunks, rows in ((1, 4, 12, 1200), (3, 13, 10, 2600)):
    got = labels(k, steps_per_epoch, chunks)
    result["reader_streams"][f"{k}-{steps_per_epoch}"] = bool(
        len(got) == rows and np.array_equal(got, plain[:rows])
    )
print(json.dumps(result))
