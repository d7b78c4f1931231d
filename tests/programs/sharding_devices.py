"""Trains the tiny CNN with BatchNorm on 8 (virtual) devices under each state sharding, with an
EMA and gradient accumulation, moves a checkpoint between layouts, and resumes a backup taken
on 8 devices on 4 and on 1; writes what the test compares to OUT.npz, the layouts to OUT.json
and the fsdp trainer's summary to OUT.summary; trains with a second mesh axis ("model") too.

    python sharding_devices.py OUT
"""

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import linen as nn  # noqa: E402
from flax import nnx  # noqa: E402

import easyfit as ef  # noqa: E402
from easyfit.core.sharding import StateSharding  # noqa: E402
from easyfit.parallel import Placement  # noqa: E402
from tests.helpers import Crash, crash_before  # noqa: E402
from tests.helpers.models import NNXMLP  # noqa: E402


class NormedCNN(nn.Module):
    """tests.helpers.models.NormedCNN without the convolution's bias: a bias right before a
    BatchNorm has no gradient but rounding noise, which Adam scales up to a full step whichever
    way the noise points (so it, and the batch means it shifts, never agree across layouts)."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(8, (3, 3), strides=(2, 2), use_bias=False)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
        return nn.Dense(10)(x.reshape((x.shape[0], -1)))


out = sys.argv[1]
(x, y) = ef.datasets.sample()["train"]
data = ef.data.Arrays(x[:64], y[:64], scale=1 / 255)
arrays: dict[str, np.ndarray] = {}
layouts: dict[str, dict] = {}


def trainer(optimizer, kind, devices=8):
    # every array above 0 bytes split (the default, 4 MiB, would leave this model replicated)
    sharding = StateSharding.of(kind, min_bytes=0)
    return ef.Trainer(
        NormedCNN(),
        optimizer=optimizer,
        seed=0,
        steps_per_execution=1,
        ema_momentum=0.9,
        gradient_accumulation_steps=2,
        sharding=sharding,
        devices=jax.devices()[:devices],
    )


def keep(name, state, layout=True):
    tree = {
        "params": state.params,
        "ema": state.ema_params,
        "stats": state.model_state,
        "opt": state.opt_state,
    }
    for keys, a in jax.tree_util.tree_leaves_with_path(tree):
        if hasattr(a, "addressable_shards"):
            arrays[f"{name}|{jax.tree_util.keystr(keys)}"] = np.asarray(a)
            if not layout:
                continue
            shard = next(s for s in a.addressable_shards if s.device == jax.devices()[0])
            spec = list(a.sharding.spec)
            while spec and spec[-1] is None:  # P("data", None) is P("data")
                spec.pop()
            layouts.setdefault(name, {})[jax.tree_util.keystr(keys)] = {
                "spec": spec,
                "bytes": int(a.nbytes),
                "device_bytes": int(shard.data.nbytes),
            }


optimizers = {"sgd": lambda: optax.sgd(0.05, momentum=0.9), "adam": lambda: optax.adam(1e-3)}
for opt, kinds in (("sgd", ("replicated", "fsdp")), ("adam", ("replicated", "zero1", "fsdp"))):
    for kind in kinds:
        t = trainer(optimizers[opt](), kind)
        shown = opt == "adam" and kind == "fsdp"  # fit's log names the layout; summary shows it
        t.fit(data, epochs=2, batch_size=16, verbose=2 if shown else 0, cache=False)
        keep(f"{opt}-{kind}", t.state)
        # compiled once: the step returns the state in the layout it takes (no recompilation)
        compiled = [fns.train(n)._cache_size() for fns in t._steps.configurations() for n in (1,)]
        arrays[f"{opt}-{kind}-compiled|train"] = np.asarray(compiled)
        if shown:
            t.summary(print_fn=lambda text: Path(out + ".summary").write_text(text))
        if opt == "adam" and kind in ("replicated", "fsdp"):
            t.save(f"{out}-{kind}.ckpt")

# tensor parallel: a second mesh axis, "model", holding halves of Dense_0's output dimension
t = ef.Trainer(
    NormedCNN(),
    optimizer=optax.adam(1e-3),
    seed=0,
    steps_per_execution=1,
    ema_momentum=0.9,
    gradient_accumulation_steps=2,
    sharding=[("Dense_0/kernel", (None, "model"))],
    mesh={"data": -1, "model": 2},
)
t.fit(data, epochs=2, batch_size=16, verbose=0, cache=False)
keep("adam-model", t.state, layout=False)
moments = [
    a
    for keys, a in jax.tree_util.tree_leaves_with_path(t.state.opt_state)
    if "mu" in jax.tree_util.keystr(keys) and "Dense_0']['kernel" in jax.tree_util.keystr(keys)
]
for part, a in (("params", t.state.params["Dense_0"]["kernel"]), ("mu", *moments)):
    shard = next(s for s in a.addressable_shards if s.device == jax.devices()[0])
    arrays[f"adam-model-{part}|layout"] = np.asarray(
        [str(a.sharding.spec), str(a.nbytes), str(shard.data.nbytes), t._layout.describe()]
    )

# a batch shard made on one device of its "model" pair (as GPU pipelines make them) and copied
# to the other
placement = Placement.create(jax.devices(), {"data": -1, "model": 2})
batch = placement.shard_device_rows(
    [jax.device_put(np.full((2, 3), i, np.float32), d) for i, d in placement.local_shards]
)
arrays["model-axis-rows|whole"] = np.asarray(batch)
arrays["model-axis-rows|shards"] = np.asarray(
    [[float(s.data[0, 0]), s.device.id] for s in sorted(batch.addressable_shards, key=lambda s: s.device.id)]
)

# a checkpoint saved under one layout restored into the other
for saved, into in (("replicated", "fsdp"), ("fsdp", "replicated")):
    t = trainer(optax.adam(1e-3), into)
    t.load(f"{out}-{saved}.ckpt")
    keep(f"{saved}->{into}", t.state)

# an NNX model the user built: placed shard by shard, trained, and written back sharded
for kind in ("replicated", "fsdp"):
    module = NNXMLP(nnx.Rngs(0))
    t = ef.Trainer(
        module,
        optimizer=optax.sgd(0.05),
        seed=0,
        steps_per_execution=1,
        sharding=StateSharding.of(kind, min_bytes=0),
    )
    t.fit(data, epochs=1, batch_size=16, verbose=0, cache=False)
    keep(f"nnx-{kind}", t.state, layout=False)
    arrays[f"nnx-{kind}-module|spec"] = np.asarray(str(module.hidden.kernel.value.sharding.spec))

# elastic resume: a backup taken under fsdp on 8 devices resumed on 4 (zero1) and 1 device
t = trainer(optax.adam(1e-3), "fsdp")
try:
    t.fit(
        data,
        epochs=2,
        batch_size=16,
        verbose=0,
        cache=False,
        callbacks=[crash_before(t, 1, 2), ef.callbacks.BackupAndRestore(out + "-b8", save_freq=1)],
    )
except Crash:
    pass
for kind, n in (("zero1", 4), ("replicated", 1)):
    shutil.copytree(out + "-b8", out + f"-b{n}")
    t = trainer(optax.adam(1e-3), kind, n)
    backup = ef.callbacks.BackupAndRestore(out + f"-b{n}", save_freq=1)
    t.fit(data, epochs=2, batch_size=16, verbose=0, cache=False, callbacks=[backup])
    keep(f"resumed-{kind}-{n}", t.state, layout=False)

np.savez(out + ".npz", **arrays)
Path(out + ".json").write_text(json.dumps(layouts))
print(jax.device_count())
