"""easyfit's writers over files written before, each under a file size limit that its new
file exceeds (``RLIMIT_FSIZE``, as a full disk: with SIGXFSZ ignored a write fails with EFBIG).

    python disk_full.py FOLDER

FOLDER holds what the test wrote before: ``export/`` (an export), ``append.csv`` and
``fresh.csv`` (CSVLogger's), ``curves.png`` (History.plot's), ``image.png`` (write_png's, as
the data sets easyfit makes are written). This program writes event files
of an earlier TensorBoard run of this second where tensorboardX names its own, then writes
again with each writer. Prints ``{writer: its error, or None}`` as JSON on its last line.
"""

import json
import os
import resource
import signal
import socket
import sys
import time

import jax.numpy as jnp
import numpy as np

from easyfit.callbacks import CSVLogger, TensorBoard
from easyfit.callbacks._plot import plot_history
from easyfit.datasets import write_png
from easyfit.persistence.export import export

folder = sys.argv[1]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write over the limit raises, not kills


def limit(nbytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.RLIM_INFINITY))


errors: dict[str, str | None] = {}


def attempt(name: str, write) -> None:
    try:
        write()
        errors[name] = None
    except OSError as e:
        errors[name] = str(e)


weights = jnp.asarray(np.random.default_rng(0).normal(size=(256, 256)), jnp.float32)  # 256 KiB
limit(64 * 1024)
attempt("export", lambda: export(os.path.join(folder, "export"), lambda x: x @ weights, (256,), "float32"))


def csv(name: str, append: bool) -> None:
    path = os.path.join(folder, name)
    limit(os.path.getsize(path) + 8)  # the new row does not fit whole
    logger = CSVLogger(path, append=append)
    logger.on_train_begin()
    try:
        logger.on_epoch_end(1, {"loss": 0.123456789, "accuracy": 0.987654321})
    finally:
        logger.on_train_end()


attempt("csv_append", lambda: csv("append.csv", True))
attempt("csv_fresh", lambda: csv("fresh.csv", False))

limit(2000)  # a smaller image than the new one
history = {"loss": [0.9, 0.5, 0.4, 0.3], "val_loss": [0.8, 0.6, 0.5, 0.45]}
attempt("plot", lambda: plot_history(history, [0, 1, 2, 3], os.path.join(folder, "curves.png")))
noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
attempt("png", lambda: write_png(os.path.join(folder, "image.png"), noise))  # data sets' images

# an earlier run's event files, named as tensorboardX names its own in these seconds
train = os.path.join(folder, "logs", "train")
os.makedirs(train)
limit(resource.RLIM_INFINITY)
now = int(time.time())
for t in range(now - 1, now + 10):
    name = f"events.out.tfevents.{t}.{socket.gethostname()}"
    with open(os.path.join(train, name), "wb") as f:
        f.write(f"earlier run {name}".encode())
limit(60)  # the new file's first records do not fit


def board() -> None:
    callback = TensorBoard(os.path.join(folder, "logs"))
    callback.on_train_begin()
    try:
        for epoch in range(4):
            callback.on_epoch_end(epoch, {"loss": 0.5 / (epoch + 1), "accuracy": 0.1 * epoch})
    finally:
        callback.on_train_end()


attempt("tensorboard", board)
limit(resource.RLIM_INFINITY)
print(json.dumps(errors))
