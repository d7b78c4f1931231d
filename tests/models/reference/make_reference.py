"""Writes the PyTorch logits that easyfit's converted models are tested against, offline.

    python tests/models/reference/make_reference.py --out DIR

Needs torch, torchvision, timm and NumPy (not safetensors, not easyfit). For each model of
draw.MODELS it draws the weights from NumPy (draw.py: the same arrays the tests draw), loads them
into the torch model with ``strict=True`` (a key list in ``<name>.keys.json`` that is wrong
fails loudly, and the model's real keys are written to ``DIR/<name>.actual_keys.json``), runs it
in eval mode, float32, on the CPU, on draw.images and saves ``DIR/<name>.npz`` with ``logits``.
Copy the .npz files into tests/models/reference/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import draw  # noqa: E402


def build(name: str):  # noqa: ANN201 (torch is imported only where it is run)
    if name == "torchvision_resnet18":
        import torchvision

        return torchvision.models.resnet18(weights=None)
    if name == "torchvision_resnet50":
        import torchvision

        return torchvision.models.resnet50(weights=None)
    if name == "timm_vit_small_patch16_224":
        import timm

        return timm.create_model("vit_small_patch16_224", pretrained=False)
    raise ValueError(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the .npz files")
    ap.add_argument("--only", nargs="*", default=list(draw.MODELS), help="models to run")
    args = ap.parse_args()
    import torch

    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    failed = []
    for name in args.only:
        model = build(name).eval().float()
        sd = model.state_dict()
        actual = [[k, list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in sd.items()]
        with open(os.path.join(args.out, f"{name}.actual_keys.json"), "w") as f:
            f.write("[\n" + ",\n".join(json.dumps(e) for e in actual) + "\n]\n")
        drawn = draw.weights(name)
        try:
            model.load_state_dict({k: torch.from_numpy(v) for k, v in drawn.items()}, strict=True)
        except RuntimeError as e:
            print(f"{name}: the key list does not match the model: {e}", file=sys.stderr)
            failed.append(name)
            continue
        x = torch.from_numpy(draw.images(name))
        with torch.no_grad():
            logits = model(x).numpy().astype(np.float32)
        np.savez(os.path.join(args.out, f"{name}.npz"), logits=logits)
        peak, finite = float(np.abs(logits).max()), bool(np.isfinite(logits).all())
        print(name, logits.shape, "max |logit|", peak, "finite", finite)
    if failed:
        sys.exit(f"key lists wrong for: {failed}")


if __name__ == "__main__":
    main()
