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

import jax
import optax

import easyfit as ef


def resnet18(num_classes: int = 1000, width: int = 64) -> ef.models.ResNet:
    """``ef.models``' ResNet-18 (NNX, NHWC); the Trainer's precision sets the passes' dtype."""
    return ef.models.ResNet([2, 2, 2, 2], bottleneck=False, num_classes=num_classes, width=width)


def resnet50(num_classes: int = 1000, width: int = 64) -> ef.models.ResNet:
    """``ef.models``' ResNet-50 v1.5 (NNX, NHWC)."""
    return ef.models.ResNet([3, 4, 6, 3], bottleneck=True, num_classes=num_classes, width=width)


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
