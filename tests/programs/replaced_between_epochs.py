"""A JPEG replaced by a broken one between epochs, in a loop of fits.

    python replaced_between_epochs.py ROOT RUNS

ROOT holds an image folder of JPEGs. Each of RUNS fits (a fresh source each) trains an epoch,
then a callback replaces the file at BROKEN by a JPEG whose quantization-table segment length
points past its end (one of the headers DALI 2.4's CPU decoder crashes the process on, see
tests/dali_repro/), and the fit goes on to a second epoch (streamed: cache=False); the good
file is put back before the next run. Prints the DataError of each run (or "trained") as JSON
on its last line; dies with the signal if DALI is handed the broken file and crashes.
"""

import json
import sys

from flax import linen as nn

import easyfit as ef

BROKEN = 34  # the file replaced, in folder order


def broken(jpeg: bytes) -> bytes:
    i = 2
    while jpeg[i + 1] != 0xDB:  # the first DQT segment
        i += 2 + int.from_bytes(jpeg[i + 2 : i + 4], "big")
    return jpeg[: i + 2] + b"\xf0\x00" + jpeg[i + 4 :]


class Replace(ef.callbacks.Callback):
    def __init__(self, path: str, data: bytes):
        super().__init__()
        self.path, self.data = path, data

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            with open(self.path, "wb") as f:
                f.write(self.data)


root, runs = sys.argv[1], int(sys.argv[2])
model = nn.Sequential([lambda v: v.reshape((v.shape[0], -1)), nn.Dense(10)])
results = []
for _ in range(runs):
    source = ef.data.ImageFolder(root)
    path = source.files[BROKEN]
    good = open(path, "rb").read()
    try:
        ef.Trainer(model, seed=0).fit(
            source, epochs=2, batch_size=50, cache=False, verbose=0, callbacks=[Replace(path, broken(good))]
        )
        results.append("trained")
    except ef.errors.DataError as e:
        results.append(str(e))
    finally:
        with open(path, "wb") as f:
            f.write(good)
print(json.dumps({"path": path, "results": results}))
