"""Reference program 1 written by hand, as DALI's JAX/Flax MNIST tutorial writes it, on Caffe2 LMDBs.

    python benchmarks/lmdb_loop.py ROOT [--epochs 5] [--batch-size 200] [--threads 4] [--cpu]

ROOT holds ``train/`` and ``val/``, Caffe2 LMDBs of encoded MNIST digits and labels (DALI_extra's
``db/MNIST/training`` and ``testing``, or ``benchmarks/make_data.py --format lmdb``). The program
is the tutorial's ("Training neural network with DALI and Flax"), unchanged but for the timing:
``fn.readers.caffe2`` (named, ``random_shuffle`` when training), ``fn.decoders.image`` on the GPU
(``mixed``, GRAY), ``fn.crop_mirror_normalize(std=255)``, ``fn.reshape(-1)``, the labels moved to
the GPU and one-hot encoded for training; batch 200, 4 threads, seed 0; the DALI JAX plugin's
``DALIGenericIterator(output_map=["images", "labels"], reader_name=..., auto_reset=True)``; the
MLP 784-1024-1024-10 in Flax linen, ``optax.sgd(0.1, momentum=0.9)``, a ``TrainState`` and a
jitted step; accuracy over the validation iterator after every epoch.

``--cpu`` (also chosen when JAX has no GPU) runs it on the CPU: ``device_id=None``, CPU decode,
labels left on the host. The last line printed is JSON, as ``benchmarks/bench.py --reference``
reads it: samples/s of training (validation excluded) in the first epoch (compilation included,
the pipelines built before it) and the median of the later ones, the first epoch's seconds, the
seconds from building the pipelines to the first epoch's end, the total seconds from then to the
end, the last validation accuracy and the device's peak memory (GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("root", help="folder holding the train/ and val/ LMDBs")
ap.add_argument("--epochs", type=int, default=5)
ap.add_argument("--batch-size", type=int, default=200)
ap.add_argument("--threads", type=int, default=4)
ap.add_argument("--cpu", action="store_true", help="JAX and DALI on the CPU (no GPU needed)")
args = ap.parse_args()

if args.cpu:
    os.environ["JAX_PLATFORMS"] = "cpu"
if "xla_gpu_enable_command_buffer" not in os.environ.get("XLA_FLAGS", ""):
    # DALI's JAX outputs and XLA's CUDA-graph command buffers do not mix (cuBLAS errors on H200);
    # easyfit sets the same flag.
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import linen as nn  # noqa: E402
from flax.training import train_state  # noqa: E402
from nvidia.dali import fn, pipeline_def, types  # noqa: E402
from nvidia.dali.plugin import jax as dax  # noqa: E402

on_gpu = jax.default_backend() == "gpu"
num_classes = 10


@pipeline_def(device_id=0 if on_gpu else None, batch_size=args.batch_size, num_threads=args.threads, seed=0)
def mnist_pipeline(data_path, random_shuffle):
    jpegs, labels = fn.readers.caffe2(
        path=data_path, random_shuffle=random_shuffle, name="mnist_caffe2_reader"
    )
    images = fn.decoders.image(jpegs, device="mixed" if on_gpu else "cpu", output_type=types.GRAY)
    images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, std=[255.0])
    images = fn.reshape(images, shape=[-1])  # the MLP takes 784 values
    if on_gpu:
        labels = labels.gpu()
    if random_shuffle:  # training
        labels = fn.one_hot(labels, num_classes=num_classes)
    return images, labels


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(784)(x))
        x = nn.relu(nn.Dense(1024)(x))
        x = nn.relu(nn.Dense(1024)(x))
        return nn.Dense(num_classes)(x)


def create_model_state(rng, learning_rate, momentum):
    model = MLP()
    params = model.init(rng, jnp.ones([784]))["params"]
    tx = optax.sgd(learning_rate, momentum)
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)


@jax.jit
def train_step(model_state, batch):
    def loss_fn(params):
        logits = model_state.apply_fn({"params": params}, batch["images"])
        return optax.softmax_cross_entropy(logits=logits, labels=batch["labels"]).mean()

    grads = jax.grad(loss_fn)(model_state.params)
    return model_state.apply_gradients(grads=grads)


def accuracy(model_state, iterator):
    correct_predictions = 0
    for batch in iterator:
        logits = model_state.apply_fn({"params": model_state.params}, batch["images"])
        correct_predictions = correct_predictions + jnp.sum(
            batch["labels"].ravel() == jnp.argmax(logits, axis=-1)
        )
    return float(correct_predictions / iterator.size)


start = time.perf_counter()
training_iterator = dax.DALIGenericIterator(
    mnist_pipeline(data_path=os.path.join(args.root, "train"), random_shuffle=True),
    output_map=["images", "labels"],
    reader_name="mnist_caffe2_reader",
    auto_reset=True,
)
validation_iterator = dax.DALIGenericIterator(
    mnist_pipeline(data_path=os.path.join(args.root, "val"), random_shuffle=False),
    output_map=["images", "labels"],
    reader_name="mnist_caffe2_reader",
    auto_reset=True,
)
model_state = create_model_state(jax.random.PRNGKey(0), learning_rate=0.1, momentum=0.9)

seconds, rates, acc = [], [], 0.0
for epoch in range(args.epochs):
    t = time.perf_counter()
    batches = 0
    for batch in training_iterator:
        model_state = train_step(model_state, batch)
        batches += 1
    jax.block_until_ready(model_state.params)
    seconds.append(time.perf_counter() - t)
    if epoch == 0:
        setup_first_epoch = time.perf_counter() - start  # the pipelines' build included
    rates.append(batches * args.batch_size / seconds[-1])
    acc = accuracy(model_state, validation_iterator)
    print(
        f"epoch {epoch}: train {seconds[-1]:.3f} s, {rates[-1]:.0f} samples/s, val accuracy {acc:.4f}",
        flush=True,
    )
total = time.perf_counter() - start
peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use", 0)
print(
    json.dumps(
        {
            "baseline": "lmdb_loop",
            "backend": jax.default_backend(),
            "epochs": args.epochs,
            "train_samples": training_iterator.size,
            "steady_samples_per_s": round(statistics.median(rates[1:]) if len(rates) > 1 else rates[0]),
            "first_epoch_samples_per_s": round(rates[0]),
            "first_epoch_s": round(seconds[0], 3),
            "setup_first_epoch_s": round(setup_first_epoch, 3),
            "total_s": round(total, 3),
            "val_accuracy": round(acc, 4),
            "peak_device_mb": round(peak / 2**20) or None,
        }
    )
)
