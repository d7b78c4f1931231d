"""Keras' ``fit(x, y)`` on NumPy arrays in memory, as in the Gluon tutorial.

    python examples/arrays.py [--data DIR] [--epochs 5]

DIR holds MNIST's four gzipped IDX files (read into arrays), or is a folder easyfit reads itself
(``train/`` and ``val/`` in any format it detects: image folders, ``.npy`` folders, LMDB, ...);
without ``--data`` the MNIST sample inside easyfit is used. Arrays go through DALI too (an
``external_source``), sharded over every device.
"""

import argparse
import os

import numpy as np
import optax
from flax import linen as nn

import easyfit as ef

IDX_FILE = "train-images-idx3-ubyte.gz"


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(256)(x.reshape((x.shape[0], -1))))
        return nn.Dense(10)(x)


def load(data_dir):
    """((x, y) for training, (x, y) for validation): arrays scaled to [0, 1], or for a folder
    easyfit reads, its ``train/`` and ``val/`` paths with no separate labels."""
    if data_dir and not os.path.isfile(os.path.join(data_dir, IDX_FILE)):
        return (os.path.join(data_dir, "train"), None), (os.path.join(data_dir, "val"), None)
    data = ef.datasets.mnist_arrays(data_dir) if data_dir else ef.datasets.sample()
    return [(x.astype(np.float32) / 255, y) for x, y in (data["train"], data["val"])]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument(
        "--data",
        metavar="DIR",
        help="MNIST's gzipped IDX files, or train/ and val/ in any format easyfit "
        "reads; none: the MNIST sample inside easyfit",
    )
    ap.add_argument("--epochs", type=int, default=5, help="epochs to train")
    args = ap.parse_args()
    (x_train, y_train), (x_val, y_val) = load(args.data)

    trainer = ef.Trainer(MLP(), optimizer=optax.adam(1e-3), metrics=["accuracy"])
    trainer.fit(
        x_train,
        y_train,
        epochs=args.epochs,
        batch_size=128,
        validation_data=(x_val, y_val) if y_val is not None else x_val,
    )
    print("evaluate:", trainer.evaluate(x_val, y_val))
    predicted = trainer.predict(x_val).argmax(-1)[:10]
    labels = y_val if y_val is not None else ef.data.to_source(x_val).known_labels()
    print("predicted:", predicted.tolist())
    print("labels:   ", labels[:10].tolist() if labels is not None else "(unknown)")


if __name__ == "__main__":
    main()
