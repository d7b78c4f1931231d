"""Reference program 1: an MLP on MNIST image files read by DALI, on one device, then on all.

    python examples/mnist_mlp.py [--data DIR] [--epochs 5]

DIR holds ``train/<digit>/*.png`` and ``val/<digit>/*.png`` (``ef.datasets.mnist(DIR)`` writes
full MNIST so); without ``--data`` the MNIST sample inside easyfit (6,000 + 1,000 images) is
written to a temporary folder and used.
"""

import argparse
import tempfile

import jax
import optax
from flax import linen as nn

import easyfit as ef


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))  # (batch, 28, 28, 1) -> (batch, 784)
        for width in (784, 1024, 1024):
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(10)(x)  # logits


def train(root: str, devices: list, epochs: int) -> float:
    batch_size = 200 // len(devices) * len(devices)  # 200 split evenly over the devices
    trainer = ef.Trainer(MLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0, devices=devices)
    history = trainer.fit(root, epochs=epochs, batch_size=batch_size)
    return history.history["val_accuracy"][-1]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument(
        "--data",
        metavar="DIR",
        help="folder with train/ and val/ class folders; none: the MNIST sample inside easyfit",
    )
    ap.add_argument("--epochs", type=int, default=5, help="epochs to train")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data or ef.datasets.sample_folder(tmp + "/mnist")
        for devices in (jax.devices()[:1], jax.devices()):
            accuracy = train(root, devices, args.epochs)
            print(f"{len(devices)} device(s): validation accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
