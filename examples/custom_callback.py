"""A callback of your own: it reads the metrics, stops training, and writes a file.

    python examples/custom_callback.py [--data DIR] [--target 0.9] [--out report.json]

DIR holds ``train/`` and ``val/`` class folders; without ``--data`` the MNIST sample inside
easyfit is written to a temporary folder and used.

``TargetAccuracy`` watches ``val_accuracy`` at the end of every epoch, stops training once it
reaches the target, and writes a JSON report of every epoch's logs when training ends. It only
overrides epoch hooks, so it costs nothing per step: easyfit never calls hooks a callback does not
override, and never reads metrics from the device for them.
"""

import argparse
import json
import tempfile

import optax
from flax import linen as nn

import easyfit as ef


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(10)(nn.relu(nn.Dense(128)(x)))


class TargetAccuracy(ef.callbacks.Callback):
    """Stops training when ``val_accuracy`` reaches ``target``; writes a report to ``path``."""

    def __init__(self, target: float, path: str):
        super().__init__()
        self.target, self.path = target, path
        self.epochs: list[dict] = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({"epoch": epoch + 1, **logs})
        if logs["val_accuracy"] >= self.target:
            print(
                f"val_accuracy {logs['val_accuracy']:.4f} reached {self.target} at epoch "
                f"{epoch + 1}: stopping"
            )
            self.model.stop_training = True  # self.model is the Trainer, as in Keras

    def on_train_end(self, logs=None):
        report = {
            "target": self.target,
            "reached": self.model.stop_training,
            "steps": int(self.model.state.step),
            "epochs": self.epochs,
        }
        with open(self.path, "w") as f:
            json.dump(report, f, indent=2)
        print(f"report written to {self.path}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument(
        "--data",
        metavar="DIR",
        help="folder with train/ and val/ class folders; none: the MNIST sample inside easyfit",
    )
    ap.add_argument("--target", type=float, default=0.9, help="validation accuracy at which training stops")
    ap.add_argument("--epochs", type=int, default=20, help="most epochs to train")
    ap.add_argument("--out", default="report.json", help="where the JSON report goes")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = args.data or ef.datasets.sample_folder(tmp + "/mnist")
        trainer = ef.Trainer(MLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0)
        trainer.fit(
            root,
            epochs=args.epochs,
            batch_size=100,
            verbose=2,
            callbacks=[TargetAccuracy(args.target, args.out)],
        )


if __name__ == "__main__":
    main()
