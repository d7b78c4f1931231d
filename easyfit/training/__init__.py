"""Training: the `Trainer` and the pure core it drives.

The steps (``steps.py``) are pure functions of a ``TrainState`` pytree (``state.py``) and a batch,
jitted once per configuration; losses, metrics, optimizers, the precision policy and models with
several outputs are resolved from Keras-style names here. The trainer coordinates: it reaches the
data through :mod:`easyfit.data` and saves through :mod:`easyfit.persistence`.

:func:`masked_mean` is here for a subclass's ``train_step``: the mean of per-sample losses over
a batch's valid rows (``ef.training.masked_mean(per_sample, batch["mask"])``).
"""

from .steps import masked_mean

__all__ = ["masked_mean"]
