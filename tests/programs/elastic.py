"""Elastic training of a tiny model that records the samples each train step received (its
``seen`` collection: one row of sample ids per step, kept in the state, so in backups too).

    python elastic.py multiprocess PROCESS_ID NUM_PROCESSES PORT OUT
    python elastic.py small OUT
    python elastic.py killed OUT
    python elastic.py resumed OUT

``multiprocess``: one of NUM_PROCESSES processes of a ``jax.distributed`` run; trains under
``fsdp`` on every process's devices and saves OUT/mp.ckpt; process 0 writes the state to
OUT/mp.npz. ``small`` (4 devices): trains the fit under ``zero1`` with
``BackupAndRestore(OUT/backup-small, save_freq=1)``, and once the backup of epoch 1's second
batch is written prints ``blocked`` and waits to be killed. ``killed`` (8 devices): trains the
same fit uninterrupted (OUT/ref.npz), loads OUT/mp.ckpt into an fsdp trainer when it exists
(OUT/mp-loaded.npz), resumes a copy of OUT/backup-small under fsdp when it exists
(OUT/resumed-8.npz), then trains the fit again with ``BackupAndRestore(OUT/backup)`` and is
blocked as ``small`` is. ``resumed`` (4 devices): resumes copies of
that backup under ``zero1`` on 4 devices (OUT/resumed-4.npz) and ``replicated`` on 2
(OUT/resumed-2.npz).
"""

import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

mode, out = sys.argv[1], sys.argv[-1]
import easyfit as ef  # noqa: E402

if mode == "multiprocess":
    pid, n, port = (int(a) for a in sys.argv[2:5])
    ef.distributed.initialize(f"127.0.0.1:{port}", n, pid, heartbeat_timeout_seconds=10)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import linen as nn  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from easyfit.core.models import adapt  # noqa: E402
from easyfit.core.sharding import StateLayout, StateSharding  # noqa: E402
from easyfit.core.state import StateMaker  # noqa: E402
from easyfit.parallel import gather_to_host  # noqa: E402

N, BATCH, EPOCHS = 64, 16, 2  # 4 steps an epoch
STEPS = EPOCHS * N // BATCH


class Recorded(nn.Module):
    """Column 0 of x is the sample's id; the rest go through two Dense layers. Each training
    call writes the batch's ids into row ``count`` of its ``seen`` collection."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        count = self.variable("seen", "count", lambda: jnp.zeros((), jnp.int32))
        ids = self.variable("seen", "ids", lambda: jnp.full((STEPS, BATCH), -1, jnp.int32))
        if train:
            ids.value = ids.value.at[count.value].set(x[:, 0].astype(jnp.int32))
            count.value = count.value + 1
        return nn.Dense(4)(nn.relu(nn.Dense(16)(x[:, 1:])))


rng = np.random.default_rng(0)
x = np.concatenate([np.arange(N, dtype=np.float32)[:, None], rng.normal(size=(N, 8)).astype(np.float32)], 1)
data = ef.data.Arrays(x, rng.integers(0, 4, N).astype(np.int32))


def trainer(kind: str, devices: int | None = None) -> ef.Trainer:
    return ef.Trainer(
        Recorded(),
        optimizer=optax.adam(1e-2),
        seed=0,
        steps_per_execution=1,
        sharding=StateSharding.of(kind, min_bytes=0),  # every array split that the rule allows
        devices=None if devices is None else jax.devices()[:devices],
    )


def fit(t: ef.Trainer, callbacks=()) -> int:
    """Fits ``t``; the number of batches this fit trained (fewer than STEPS when it resumed)."""
    batches = []
    counter = ef.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: batches.append(batch))
    t.fit(data, epochs=EPOCHS, batch_size=BATCH, verbose=0, cache=False, callbacks=[*callbacks, counter])
    return len(batches)


def write(state, name: str, **facts: int) -> None:
    """The state's arrays (whole, on every process) to OUT/<name>.npz, and to OUT/<name>.json
    its number of devices and ``facts``, from process 0."""
    tree = {"params": state.params, "opt": state.opt_state, "seen": state.model_state["seen"]}
    arrays = {
        jax.tree_util.keystr(k): gather_to_host(a) for k, a in jax.tree_util.tree_leaves_with_path(tree)
    }
    if jax.process_index() == 0:
        np.savez(os.path.join(out, name + ".npz"), **arrays)
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump({"devices": len(state.step.sharding.device_set), **facts}, f)


class _Reads(logging.Handler):
    """Counts the kept initial states read (easyfit logs each)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += record.getMessage().startswith("easyfit: initial state read from")


def initial(name: str) -> None:
    """A fresh state made as an fsdp trainer makes it, by a new StateMaker (a new jit: nothing
    of an earlier one reused), to OUT/<name>.npz, with how many kept initial states it read."""
    layout = StateLayout(StateSharding.of("fsdp", min_bytes=0), Mesh(np.array(jax.devices()), ("data",)))
    reads, logger = _Reads(), logging.getLogger("easyfit")
    logger.addHandler(reads)
    level, logger.level = logger.level, logging.INFO
    try:
        state = StateMaker(adapt(Recorded())[0], optax.adam(1e-2)).make(0, (9,), layout=layout)
    finally:
        logger.removeHandler(reads)
        logger.setLevel(level)
    write(state, name, reads=reads.count)


def interrupted(t: ef.Trainer, backup: str) -> None:
    """Trains ``t`` with ``BackupAndRestore(OUT/<backup>, save_freq=1)`` until the backup of
    epoch 1's second batch is written, then prints ``blocked`` and waits to be killed."""
    backups = os.path.join(out, backup, "easyfit-backups")

    def block(batch, logs):
        if t.progress.epoch == 1 and batch == 2:  # epoch 1's batches 0 and 1 trained (step 6)
            # their asynchronous backup, which BackupAndRestore numbers epoch * (steps + 1) + batch
            while not os.path.isdir(os.path.join(backups, "7")):
                time.sleep(0.05)
            print("blocked", flush=True)
            time.sleep(600)

    fit(
        t,
        [
            ef.callbacks.LambdaCallback(on_train_batch_begin=block),
            ef.callbacks.BackupAndRestore(os.path.join(out, backup), save_freq=1),
        ],
    )
    print("not killed", flush=True)


if mode == "multiprocess":
    # the initial state sharded across processes, kept by each process (its shards) and read back
    initial("mp-initial")
    initial("mp-initial-read")
    t = trainer("fsdp")
    fit(t)
    t.save(os.path.join(out, "mp.ckpt"))  # every process writes its shards
    write(t.state, "mp")
elif mode == "small":
    interrupted(trainer("zero1"), "backup-small")
elif mode == "killed":
    t = trainer("fsdp")
    fit(t)
    write(t.state, "ref")
    if os.path.isdir(os.path.join(out, "mp.ckpt")):  # the 2-process checkpoint into 1 x 8
        t = trainer("fsdp")
        t.load(os.path.join(out, "mp.ckpt"))
        write(t.state, "mp-loaded")
    if os.path.isdir(os.path.join(out, "backup-small")):  # killed on 4 devices, resumed on 8
        grown = os.path.join(out, "backup-8")
        shutil.copytree(os.path.join(out, "backup-small"), grown)
        t = trainer("fsdp")
        batches = fit(t, [ef.callbacks.BackupAndRestore(grown, save_freq=1)])
        write(t.state, "resumed-8", batches=batches)
    interrupted(trainer("fsdp"), "backup")
else:
    for kind, devices in (("zero1", 4), ("replicated", 2)):
        backup = os.path.join(out, f"backup-{devices}")
        shutil.copytree(os.path.join(out, "backup"), backup)
        t = trainer(kind, devices)
        batches = fit(t, [ef.callbacks.BackupAndRestore(backup, save_freq=1)])
        write(t.state, f"resumed-{devices}", batches=batches)
print("done", jax.process_index(), jax.device_count(), flush=True)
