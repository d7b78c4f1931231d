"""The ImageNet recipe through fit: ResNet-50 v1.5, SGD with Nesterov momentum, bfloat16.

    python examples/imagenet_resnet.py --data DIR [--epochs 90] [--batch-size 1024]
    python examples/imagenet_resnet.py --smoke

DIR is laid out like ImageNet: ``DIR/train/<wnid>/*.JPEG`` and ``DIR/val/<wnid>/*``. The recipe
is that of Flax's ImageNet example: ResNet-50 v1.5 with BatchNorm; SGD with Nesterov momentum
0.9, a learning rate of 0.1 per 256 images, 5 epochs of linear warm-up then a cosine decay;
weight decay 1e-4 on the kernels only; label smoothing 0.1; the passes in bfloat16. The input
side runs in DALI: training images are decoded and cut to a random crop (8 % to 100 % of the
area, aspect ratio 3/4 to 4/3), resized to 224x224, flipped at random and normalised with
ImageNet's mean and standard deviation; validation images are resized (shorter side 256) and
center-cropped to 224x224. ``--smoke`` writes a tiny folder of generated photos and trains a
narrow ResNet-18 on it for one epoch, on any machine.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

import easyfit as ef


class Block(nn.Module):
    """A residual block: two 3x3 convolutions (basic) or 1x1-3x3-1x1 (bottleneck, with the
    stride on the 3x3 convolution: ResNet v1.5)."""

    filters: int
    strides: int = 1
    bottleneck: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        conv = functools.partial(nn.Conv, use_bias=False)
        norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5)
        s = (self.strides, self.strides)
        if self.bottleneck:
            y = nn.relu(norm()(conv(self.filters, (1, 1))(x)))
            y = nn.relu(norm()(conv(self.filters, (3, 3), s)(y)))
            out = self.filters * 4
            y = norm(scale_init=nn.initializers.zeros)(conv(out, (1, 1))(y))
        else:
            y = nn.relu(norm()(conv(self.filters, (3, 3), s)(x)))
            out = self.filters
            y = norm(scale_init=nn.initializers.zeros)(conv(out, (3, 3))(y))
        if x.shape != y.shape:  # the shortcut projects when the shape changes
            x = norm()(conv(out, (1, 1), s)(x))
        return nn.relu(x + y)


class ResNet(nn.Module):
    """ResNet v1.5 on NHWC images; returns logits."""

    stage_sizes: Sequence[int]
    num_classes: int = 1000
    bottleneck: bool = True
    width: int = 64

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        x = nn.Conv(self.width, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], use_bias=False)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5)(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for i, blocks in enumerate(self.stage_sizes):
            for j in range(blocks):
                x = Block(self.width * 2**i, 2 if i > 0 and j == 0 else 1, self.bottleneck)(x, train)
        return nn.Dense(self.num_classes)(jnp.mean(x, axis=(1, 2)))


def resnet18(num_classes: int = 1000, width: int = 64) -> ResNet:
    return ResNet([2, 2, 2, 2], num_classes, bottleneck=False, width=width)


def resnet50(num_classes: int = 1000, width: int = 64) -> ResNet:
    return ResNet([3, 4, 6, 3], num_classes, bottleneck=True, width=width)


def smoothed_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-sample softmax cross-entropy against labels smoothed by 0.1."""
    targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), 0.1)
    return optax.softmax_cross_entropy(logits, targets)


def optimizer(
    batch_size: int, steps_per_epoch: int, epochs: int, warmup_epochs: int = 5, weight_decay: float = 1e-4
) -> optax.GradientTransformation:
    """SGD with Nesterov momentum, lr 0.1 per 256 images, linear warm-up then cosine decay;
    weight decay on the kernels (arrays of two or more dimensions) only."""
    peak = 0.1 * batch_size / 256
    warmup = min(warmup_epochs, max(epochs - 1, 0)) * steps_per_epoch
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, peak, max(warmup, 1), max(epochs * steps_per_epoch, warmup + 1)
    )
    kernels = functools.partial(jax.tree_util.tree_map, lambda p: p.ndim > 1)
    return optax.chain(
        optax.add_decayed_weights(weight_decay, mask=kernels),
        optax.sgd(schedule, momentum=0.9, nesterov=True),
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--data", metavar="DIR", help="a folder with train/<class>/ and val/<class>/")
    ap.add_argument("--smoke", action="store_true", help="a tiny generated folder, one epoch")
    ap.add_argument("--model", choices=["resnet50", "resnet18"], default="resnet50", help="the ResNet")
    ap.add_argument("--epochs", type=int, default=90, help="epochs to train")
    ap.add_argument("--batch-size", type=int, default=1024, help="the global batch")
    ap.add_argument("--image-size", type=int, default=224, help="side of the square crops")
    ap.add_argument("--precision", default="bfloat16", help="the Trainer's precision")
    args = ap.parse_args()
    width = 64
    if args.smoke:
        args.data = ef.datasets.synthetic_images(
            os.path.join(tempfile.mkdtemp(), "photos"),
            classes=4,
            per_class=(24, 8),
            size=(40, 80),
            image_format="png",
        )
        args.model, args.epochs, args.batch_size, args.image_size, width = ("resnet18", 1, 16, 32, 8)
    elif args.data is None:
        ap.error("give --data DIR (laid out like ImageNet) or --smoke")
    size = (args.image_size, args.image_size)
    augment = ef.data.Augment(random_resized_crop=(0.08, 1.0), flip=True)
    train = ef.data.ImageFolder(
        os.path.join(args.data, "train"), image_size=size, augment=augment, normalize="imagenet"
    )
    model = {"resnet50": resnet50, "resnet18": resnet18}[args.model](len(train.class_names), width)
    steps = -(-len(train) // args.batch_size)
    trainer = ef.Trainer(
        model,
        optimizer=optimizer(args.batch_size, steps, args.epochs),
        loss=smoothed_cross_entropy,
        metrics=["accuracy"],
        precision=args.precision,
    )
    history = trainer.fit(
        train, validation_data=os.path.join(args.data, "val"), epochs=args.epochs, batch_size=args.batch_size
    )
    print(f"validation accuracy after {args.epochs} epochs: {history.history['val_accuracy'][-1]:.4f}")


if __name__ == "__main__":
    main()
