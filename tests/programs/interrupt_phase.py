"""A fit to interrupt with Ctrl-C in one phase: send SIGINT when it prints ``phase PHASE``.

    python interrupt_phase.py PHASE CHECKPOINT_DIR

PHASE is where fit is when the program prints ``phase PHASE`` (flushed):

- ``compile``: the first training step compiles (seconds: an unrolled loop) while the state
  initialises; printed when the step is traced.
- ``chunk``: the first chunk is read, slowly (each of its four runs' feeds waits a second), by
  the loader's thread while the first step compiles, as on a GPU machine; printed at the
  chunk's third feed (DALI fed two ahead for the first run, which gave the shapes), once the
  compilation has begun.
- ``validation``: the first validation pass reads its data.
- ``save``: a callback saves the model at the end of the first epoch.

In ``validation`` and ``save`` fit defers the first SIGINT until the step in progress ends: the
program then prints ``noted`` once it sees that the first one came (fit put Python's own handler
back), and goes on reading (validation) or saving (save) until a second one interrupts it.

The program catches the KeyboardInterrupt fit raises, prints ``caught KeyboardInterrupt`` and
``left running: `` with the names of easyfit's threads still running (``nothing``), and ends:
its exit status must be 0.
"""

import dataclasses
import signal
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

import easyfit as ef

phase, folder = sys.argv[1:3]
LOOP = 300 if phase in ("compile", "chunk") else 2  # the unrolled loop: seconds to compile, or none
printed: set[str] = set()


def say(line: str) -> None:
    if line not in printed:
        printed.add(line)
        print(line, flush=True)


def noted() -> bool:
    """Whether fit has seen a first SIGINT: it put Python's own handler back."""
    return signal.getsignal(signal.SIGINT) is signal.default_int_handler


def wait_for(condition, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


class Model(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dense(8)(x.reshape((x.shape[0], -1)))
        if train:
            if phase == "compile" and threading.current_thread().name == "easyfit-compile":
                say("phase compile")
            x = jax.lax.fori_loop(0, LOOP, lambda i, h: jnp.tanh(h * 1.01 + 0.1), x, unroll=True)
        return nn.Dense(10)(x)


class Slow(ef.data.Arrays):
    """Arrays whose feeds mark the phase (and are slow in it)."""

    def __init__(self, x, y, role: str):
        super().__init__(x, y)
        self.role = role
        self.feeds = 0

    def feed(self, indices):
        if self.role == phase == "chunk":  # in the loader's thread, 4 feeds a chunk
            self.feeds += 1
            if self.feeds == 3:  # the first chunk's third run (DALI fed two for the shapes' run)
                wait_for(lambda: any(t.name == "easyfit-compile" for t in threading.enumerate()))
                say("phase chunk")
            time.sleep(1.0)
        if self.role == phase == "validation":
            say("phase validation")
            wait_for(noted)
            say("noted")
            wait_for(lambda: False, 60.0)  # until the second SIGINT interrupts the pass
        return super().feed(indices)


def save_until_interrupted(epoch, logs):
    if phase != "save":
        return
    say("phase save")
    wait_for(noted)
    say("noted")
    for _ in range(500):  # saves until the second SIGINT interrupts one
        trainer.save(folder)


rng = np.random.default_rng(0)
# chunks of 16 samples, one pipeline run each; for "chunk", of 1,024 in four runs of 256
n, batch, per = (2048, 64, 16) if phase == "chunk" else (32, 4, 4)
x, y = rng.random((n, 4, 4, 1), np.float32), np.arange(n) % 10
trainer = ef.Trainer(Model(), optimizer="adam", seed=0, steps_per_execution=per)
if phase in ("compile", "chunk"):
    # as on a GPU machine: the loader's thread
    trainer._data.loader_options = dataclasses.replace(trainer._data.loader_options, threaded=True)
try:
    trainer.fit(
        Slow(x, y, "chunk"),
        epochs=2,
        batch_size=batch,
        verbose=0,
        cache=False,
        validation_data=Slow(x[:8], y[:8], "validation"),
        callbacks=[ef.callbacks.LambdaCallback(on_epoch_end=save_until_interrupted)],
    )
except KeyboardInterrupt:
    print("caught KeyboardInterrupt", flush=True)  # then the interpreter exits, status 0
    # threads still executing (a Thread.join that Ctrl-C interrupted marks its thread as ended)
    executing = sys._current_frames()
    left = sorted(
        t.name for t in threading.enumerate() if t.name.startswith("easyfit-") and t.ident in executing
    )
    print("left running:", " ".join(left) or "nothing", flush=True)
else:
    print("fit ended without an interrupt", flush=True)
