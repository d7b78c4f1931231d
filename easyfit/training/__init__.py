"""Training: the `Trainer`, the coordinator on top of the layers.

The trainer drives the pure core (:mod:`easyfit.core`: the ``TrainState`` pytree, the jitted
steps, losses, metrics, optimizers, the precision policy and models with several outputs); it
reaches the data through :mod:`easyfit.data`, saves through :mod:`easyfit.persistence` and calls
the :mod:`easyfit.callbacks`. Besides ``trainer.py``, this package holds only what the trainer
alone uses: its compiled steps per configuration (``compiled.py``), the labels checked against the
loss (``labels.py``), fit's options, argument checks, Ctrl-C and the input wait.

:func:`masked_mean` is here for a subclass's ``train_step``: the mean of per-sample losses over
a batch's valid rows (``ef.training.masked_mean(per_sample, batch["mask"])``). The core's modules
are reachable from here too (``ef.training.losses``, ``ef.training.learning_rate``, ...), as they
were when they lived in this package.
"""

from ..core import (
    initial_states,
    learning_rate,
    losses,
    metrics,
    models,
    multi_output,
    optimizers,
    precision,
    state,
    steps,
)
from ..core.steps import masked_mean

__all__ = [
    "initial_states",
    "learning_rate",
    "losses",
    "masked_mean",
    "metrics",
    "models",
    "multi_output",
    "optimizers",
    "precision",
    "state",
    "steps",
]
