"""Observing the samples fit trains on: inputs that encode their index, a Trainer that
records the valid rows of every step it trains (from inside the jitted step), and the batches
a source's loader delivers."""

from __future__ import annotations

import jax
import numpy as np

import easyfit as ef


def indexed(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: ``x[i] == i`` (a float feature), labels of 3 classes."""
    return np.arange(n, dtype=np.float32)[:, None], (np.arange(n) % 3).astype(np.int32)


def loader_batches(source, n: int, *, batch_size: int, shuffle: bool = True, seed: int = 0) -> list[dict]:
    """The first ``n`` batches that a ``Loader`` of ``source`` delivers on one device (across
    epochs when ``n`` is more than an epoch), each ``{key: np.ndarray}``."""
    plan = ef.data.Plan(source.num_samples, batch_size, shuffle=shuffle, seed=seed)
    loader = ef.data.Loader(source, plan, ef.parallel.Placement.create())
    try:
        return [{k: np.asarray(v) for k, v in next(loader).items()} for _ in range(n)]
    finally:
        loader.close()


def passes(n: int, seed: int, count: int) -> np.ndarray:
    """The samples of ``count`` shuffled passes over ``n`` samples, one after the other."""
    return np.concatenate([ef.data.epoch_permutation(n, seed, p) for p in range(count)])


class Recorder(ef.Trainer):
    """A Trainer whose loss records each trained step's valid inputs in ``self.seen`` (one
    array per step, in training order); fully masked steps are not run and
    record nothing. Evaluation records too: fit these without validation data."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[np.ndarray] = []

    def _record(self, x, mask) -> None:
        self.seen.append(np.asarray(x)[np.asarray(mask).astype(bool)].ravel().astype(int))

    def compute_loss(self, outputs, batch):
        jax.debug.callback(self._record, batch["x"], batch["mask"])
        return super().compute_loss(outputs, batch)

    def stream(self) -> np.ndarray:
        """Every sample trained on, in order."""
        jax.effects_barrier()
        return np.concatenate(self.seen) if self.seen else np.zeros(0, int)


def fit_indexed(
    trainer: ef.Trainer, n: int, batch_size: int, epochs: int, steps_per_epoch, callbacks=(), **kwargs
):
    """``trainer.fit`` on :func:`indexed` data of ``n`` samples, silently."""
    x, y = indexed(n)
    return trainer.fit(
        x,
        y,
        batch_size=batch_size,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        verbose=0,
        callbacks=list(callbacks),
        **kwargs,
    )
