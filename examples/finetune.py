"""Fine-tune a pretrained ResNet or ViT from a safetensors file on a folder of images.

    python examples/finetune.py --weights DIR_OR_FILE --data DIR [--model resnet50]
        [--layout timm] [--trainable head] [--epochs 3]
    python examples/finetune.py --smoke

DIR holds ``train/<class>/*`` and ``val/<class>/*``. The weights are timm's, torchvision's or
Hugging Face's (``--layout``): a ``.safetensors`` file, or a folder (a download, a hub cache)
with ``model.safetensors`` and ``config.json``. The head is replaced for the folder's classes;
``--trainable head`` trains it alone (the backbone frozen: no optimizer state, its BatchNorm
in inference mode), ``all`` trains everything, with the backbone at a tenth of the rate. The
weights' preprocessing (input size, crop, mean and std) becomes the folder's recipe.
``--smoke`` draws a tiny ResNet's weights itself, saves them as timm would, and fine-tunes
them on the packaged MNIST sample for one epoch, offline.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

import numpy as np
import optax
from flax import nnx
from safetensors.numpy import save_file

import easyfit as ef


def save_as_timm(model: nnx.Module, folder: str, pretrained_cfg: dict) -> str:
    """Writes ``model``'s weights as timm's ``model.safetensors`` (PyTorch's names and
    layouts) and its ``config.json``: a stand-in for a download."""
    arrays = {}
    for key, var in nnx.to_flat_state(nnx.state(model, nnx.Any(nnx.Param, nnx.BatchStat))):
        name, a = ".".join(str(k) for k in key), np.asarray(var[...])
        if name.endswith(".kernel"):
            name, a = name[:-6] + "weight", a.transpose(3, 2, 0, 1) if a.ndim == 4 else a.T
        name = (
            name.replace(".scale", ".weight")
            .replace(".mean", ".running_mean")
            .replace(".var", ".running_var")
        )
        arrays[name] = np.ascontiguousarray(a)
    os.makedirs(folder, exist_ok=True)
    save_file(arrays, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"architecture": "resnet", "num_classes": 1000, "pretrained_cfg": pretrained_cfg}, f)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--weights", help="a .safetensors file or a folder holding model.safetensors")
    ap.add_argument("--data", metavar="DIR", help="a folder with train/<class>/ and val/<class>/")
    ap.add_argument("--model", default="resnet50", help="timm's name: resnet50, vit_base_patch16_224, ...")
    ap.add_argument("--layout", default="timm", choices=["timm", "torchvision", "hf"], help="the keys' names")
    ap.add_argument("--trainable", default="head", choices=["head", "all"], help="what trains")
    ap.add_argument("--epochs", type=int, default=3, help="epochs to train")
    ap.add_argument("--batch-size", type=int, default=64, help="the global batch")
    ap.add_argument("--learning-rate", type=float, default=1e-3, help="Adam's rate for the head")
    ap.add_argument("--precision", default="float32", help="the Trainer's precision (bfloat16 on GPUs)")
    ap.add_argument("--smoke", action="store_true", help="tiny drawn weights, the packaged sample")
    args = ap.parse_args()
    kwargs: dict = {}
    if args.smoke:
        tmp = tempfile.mkdtemp()
        args.data = ef.datasets.sample_folder(os.path.join(tmp, "mnist"), limit=(64, 32))
        kwargs = {"width": 8}  # a narrow ResNet-18 stands in for the pretrained one
        pretrained = ef.models.create_model("resnet18", 1000, **kwargs)
        cfg = {"input_size": [3, 32, 32], "interpolation": "bilinear", "crop_pct": 0.875}
        cfg |= {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}
        args.weights = save_as_timm(pretrained, os.path.join(tmp, "weights"), cfg)
        args.model, args.epochs, args.batch_size = "resnet18", 1, 16
    elif args.data is None or args.weights is None:
        ap.error("give --weights and --data DIR, or --smoke")
    # the weights' recipe (input size, crop, mean and std), unless they name none
    pre = ef.models.Preprocessing.read(args.weights) or ef.models.Preprocessing()
    recipe = pre.image_folder_kwargs(color_mode="rgb", augment=ef.data.Augment(flip=True))
    train = ef.data.ImageFolder(os.path.join(args.data, "train"), **recipe)
    model = ef.models.create_model(
        args.model, len(train.class_names), weights=args.weights, layout=args.layout, **kwargs
    )
    head: Any = getattr(model, "fc", None) or getattr(model, "head", None)  # ResNet: fc, ViT: head
    print(f"{args.model}: head replaced for {len(train.class_names)} classes: {head.kernel.shape}")
    lr = args.learning_rate
    if args.trainable == "head":
        tx = ef.models.trainable(model, optax.adam(lr), "head")
    else:  # the backbone at a tenth of the head's rate
        head_re = "^fc/" if hasattr(model, "fc") else "^head/"
        tx = ef.models.trainable(model, optax.adam(lr / 10), "all", groups={head_re: optax.adam(lr)})
    trainer = ef.Trainer(model, optimizer=tx, metrics=["accuracy"], precision=args.precision)
    history = trainer.fit(
        train, validation_data=os.path.join(args.data, "val"), epochs=args.epochs, batch_size=args.batch_size
    )
    print(f"validation accuracy after {args.epochs} epochs: {history.history['val_accuracy'][-1]:.4f}")


if __name__ == "__main__":
    main()
