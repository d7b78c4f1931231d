"""``ef.models``' converted models against PyTorch's on the same GPU, with the same drawn weights.

    python benchmarks/gpu_parity.py [--only torchvision_resnet18 ...] [--json OUT]

Needs torch, torchvision and timm beside easyfit. For each model of the tests' references
(tests/models/reference/draw.py: weights drawn from NumPy in the ``state_dict``'s key order and
shapes), the torch model gets the weights with ``strict=True`` and runs in eval mode, float32,
on the GPU; easyfit's model loads the same arrays from a safetensors file (``load_weights``)
and runs on the GPU through JAX, float32 with the highest matmul precision (TF32 off on both
sides). Prints the largest absolute difference of the logits, relative to the largest logit.
The CPU suite checks the same models against logits saved from the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp
    import torch
    from safetensors.numpy import save_file

    import easyfit as ef
    from tests.models.reference import draw
    from tests.models.reference.make_reference import build

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    makers = {
        "torchvision_resnet18": (ef.models.resnet18, "torchvision"),
        "torchvision_resnet50": (ef.models.resnet50, "torchvision"),
        "timm_vit_small_patch16_224": (ef.models.vit_small_patch16_224, "timm"),
    }
    rows = []
    for name in args.only or list(draw.MODELS):
        weights = draw.weights(name)
        x = draw.images(name)
        tm = build(name).eval().float().cuda()
        tm.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
        with torch.no_grad():
            want = tm(torch.from_numpy(x).cuda()).cpu().numpy()
        make, layout = makers[name]
        model = make()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"{name}.safetensors")
            save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, path)
            ef.models.load_weights(model, path, layout)
        model.eval()
        with jax.default_matmul_precision("highest"):
            got = np.asarray(jax.jit(lambda m, v: m(v))(model, jnp.asarray(x.transpose(0, 2, 3, 1))))
        diff = float(np.abs(got - want).max() / np.abs(want).max())
        row = {"model": name, "device": torch.cuda.get_device_name(), "max_abs_diff_vs_max_logit": diff}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
