"""Keras' ``fit(x, y)`` on NumPy arrays in memory, as in the Gluon tutorial.

    python examples/arrays.py [--data DIR] [--epochs 5]

DIR holds MNIST's four gzipped IDX files; without ``--data`` the MNIST sample inside easyfit is
used. Arrays go through DALI too (an ``external_source``), sharded over every device.
"""

import argparse

import numpy as np
import optax
from flax import linen as nn

import easyfit as ef


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(256)(x.reshape((x.shape[0], -1))))
        return nn.Dense(10)(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", metavar="DIR", help="folder with MNIST's gzipped IDX files")
    ap.add_argument("--epochs", type=int, default=5)
    args = ap.parse_args()
    data = ef.datasets.mnist_arrays(args.data) if args.data else ef.datasets.sample()
    (x_train, y_train), (x_val, y_val) = data["train"], data["val"]
    x_train, x_val = x_train.astype(np.float32) / 255, x_val.astype(np.float32) / 255

    trainer = ef.Trainer(MLP(), optimizer=optax.adam(1e-3), metrics=["accuracy"])
    trainer.fit(x_train, y_train, epochs=args.epochs, batch_size=128,
                validation_data=(x_val, y_val))
    print("evaluate:", trainer.evaluate(x_val, y_val))
    predicted = trainer.predict(x_val[:10]).argmax(-1)
    print("predicted:", predicted.tolist())
    print("labels:   ", y_val[:10].tolist())


if __name__ == "__main__":
    main()
