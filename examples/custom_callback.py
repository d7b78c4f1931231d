"""A callback of your own: it reads the metrics, writes them to a CSV file, stops training.

    python examples/custom_callback.py [--data DIR] [--epochs 10] [--target 0.95] [--csv FILE]

DIR holds ``train/`` and ``val/`` class folders; without ``--data`` the MNIST sample inside
easyfit is written to a temporary folder and used.
"""

import argparse
import csv
import tempfile

import optax
from flax import linen as nn

import easyfit as ef


class StopAtAccuracy(ef.callbacks.Callback):
    """Writes each epoch's metrics to ``path``; stops once ``val_accuracy`` reaches ``target``."""

    def __init__(self, target: float, path: str):
        super().__init__()
        self.target, self.path = target, path

    def on_train_begin(self, logs=None):
        self.file = open(self.path, "w", newline="")
        self.writer = None

    def on_epoch_end(self, epoch, logs=None):
        if self.writer is None:  # the first epoch tells which metrics there are
            self.writer = csv.DictWriter(self.file, fieldnames=["epoch", *logs])
            self.writer.writeheader()
        self.writer.writerow({"epoch": epoch + 1, **logs})
        self.file.flush()
        if logs["val_accuracy"] >= self.target:
            print(f"val_accuracy {logs['val_accuracy']:.4f} >= {self.target}: stopping")
            self.trainer.stop_training = True

    def on_train_end(self, logs=None):
        self.file.close()


class SmallMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(128)(x.reshape((x.shape[0], -1))))
        return nn.Dense(10)(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", metavar="DIR", help="folder with train/ and val/ class folders")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--target", type=float, default=0.95, help="val_accuracy to stop at")
    ap.add_argument("--csv", default="metrics.csv", help="where to write the metrics")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data or ef.datasets.sample_folder(tmp + "/mnist")
        trainer = ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9))
        history = trainer.fit(root, epochs=args.epochs, batch_size=100,
                              callbacks=[StopAtAccuracy(args.target, args.csv)])
    print(f"trained {len(history.epoch)} epoch(s); metrics in {args.csv}")


if __name__ == "__main__":
    main()
