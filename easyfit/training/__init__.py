"""Training: the `Trainer` and the pure core it drives.

The steps (``steps.py``) are pure functions of a ``TrainState`` pytree (``state.py``) and a batch,
jitted once per configuration; losses, metrics, optimizers, the precision policy and models with
several outputs are resolved from Keras-style names here. The trainer coordinates: it reaches the
data through :mod:`easyfit.data` and saves through :mod:`easyfit.persistence`.
"""
