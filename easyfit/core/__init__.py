"""The pure training core: what a training step is made of, with no knowledge of the data side,
of files or of callbacks.

The steps (``steps.py``) are pure functions of a ``TrainState`` pytree (``state.py``, made by
``StateMaker``; initial states kept on disk: ``initial_states.py``) and a batch, jitted once per
configuration; losses (``losses.py``), metrics (``metrics.py``), optimizers (``optimizers.py``),
the learning rate an optimizer state exposes (``learning_rate.py``), the precision policy
(``precision.py``) and models with several outputs (``multi_output.py``) are resolved from
Keras-style names here; ``models.py`` puts linen and NNX models behind one adapter. The core
imports only the base utilities (``errors``, ``_env``, ``parallel``); the data side, persistence,
callbacks and the ``Trainer`` import it.
"""
