"""``easyfit demo``: the DALI + Flax MNIST tutorial's MLP on the MNIST sample inside the package.

The sample is written out as PNG class folders in a temporary directory, so the demo takes the
path users' own image folders take: DALI reads and decodes every image.
"""

from __future__ import annotations

import os
import tempfile
import time

import jax
import optax
from flax import linen as nn

from . import datasets
from .training.trainer import Trainer

__all__ = ["MLP", "run_demo"]

CURVES = "learning_curves.png"


class MLP(nn.Module):
    """The DALI + Flax MNIST tutorial's model: Dense 784 -> 1024 -> 1024 -> 10, ReLU between."""

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        for width in (784, 1024, 1024):
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(10)(x)


def run_demo(out: str | os.PathLike = ".", epochs: int = 5, verbose: int = 1) -> float:
    """Trains the MLP on the sample's 6,000 images, validates on its 1,000, draws the curves.

    Args:
        out: folder for ``learning_curves.png`` (created if needed).
        epochs: epochs to train.
        verbose: the Trainer's verbosity (1: progress bar).

    Returns:
        The validation accuracy after the last epoch.
    """
    n = jax.device_count()
    batch_size = max(n, 200 // n * n)
    with tempfile.TemporaryDirectory(prefix="easyfit-demo-") as tmp:
        start = time.perf_counter()
        root = datasets.sample_folder(os.path.join(tmp, "mnist"))
        print(
            f"easyfit demo: the MNIST sample inside easyfit, 6,000 training and 1,000 "
            f"validation images, written as PNG files to {root} in "
            f"{time.perf_counter() - start:.1f}s; DALI reads and decodes them.\n"
            f"model: MLP 784-1024-1024-10, SGD(0.1, momentum 0.9), batch {batch_size}, "
            f"{epochs} epoch{'s' if epochs > 1 else ''}, on {n} {jax.default_backend()} "
            f"device{'s' if n > 1 else ''}",
            flush=True,
        )
        trainer = Trainer(MLP(), optimizer=optax.sgd(0.1, momentum=0.9), seed=0)
        history = trainer.fit(root, epochs=epochs, batch_size=batch_size, verbose=verbose)
    accuracy = history.history["val_accuracy"][-1]
    print(f"validation accuracy: {accuracy:.4f} (1,000 images the model did not train on)")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(os.fspath(out), CURVES)
    try:
        history.plot(path)
        print(f"learning curves: {os.path.abspath(path)}")
    except ImportError as e:
        print(f"no learning curves drawn: {e}")
    return accuracy
