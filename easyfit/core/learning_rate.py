"""The learning rate held in an optimizer's state, found and changed from outside the optimizer.

An optax optimizer keeps its learning rate inside its update function, out of reach, unless it
was built with ``optax.inject_hyperparams``: then the state holds ``hyperparams["learning_rate"]``
(a constant you may change, or the value of a schedule at the last step). The Trainer reports it
in the epoch logs as ``learning_rate``; ``LearningRateScheduler`` and ``ReduceLROnPlateau`` change
it.

Example:
    >>> import jax.numpy as jnp, optax
    >>> from easyfit.core.learning_rate import get_learning_rate, set_learning_rate
    >>> tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
    >>> opt_state = tx.init({"w": jnp.zeros(2)})
    >>> round(get_learning_rate(opt_state), 6)
    0.1
    >>> round(get_learning_rate(set_learning_rate(opt_state, 0.05)), 6)
    0.05
    >>> get_learning_rate(optax.sgd(0.1).init({"w": jnp.zeros(2)})) is None
    True
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

__all__ = ["get_learning_rate", "has_learning_rate", "set_learning_rate"]

_KEY = "learning_rate"
_INJECTED = tuple({optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState})


def _injected(node: Any) -> bool:
    return isinstance(node, _INJECTED) and _KEY in node.hyperparams


def _states(opt_state: Any) -> list[Any]:
    leaves = jax.tree_util.tree_leaves(opt_state, is_leaf=_injected)
    return [leaf for leaf in leaves if _injected(leaf)]


def _scheduled(node: Any) -> bool:
    """Whether the injected learning rate of ``node`` is an optax schedule (optax keeps a
    schedule's state in ``hyperparams_states`` and sets the rate from it at every step)."""
    return _KEY in getattr(node, "hyperparams_states", {})


def has_learning_rate(opt_state: Any) -> bool:
    """Whether ``opt_state`` holds an injected learning rate."""
    return bool(_states(opt_state))


def get_learning_rate(opt_state: Any) -> float | None:
    """The (first) injected learning rate in ``opt_state``, or None when there is none.

    Reading it copies one scalar from the device: call it per epoch, not per step.
    """
    states = _states(opt_state)
    return float(states[0].hyperparams[_KEY]) if states else None


def set_learning_rate(opt_state: Any, value: float) -> Any:
    """``opt_state`` with every injected learning rate set to ``value`` (same dtype, same
    placement, so the compiled train step is reused).

    Raises:
        ValueError: the optimizer has no injected learning rate.
        TypeError: the injected learning rate is an optax schedule: the optimizer sets it
            from the schedule at every step, so a value set here would not last (Keras raises
            TypeError for an optimizer made with a ``LearningRateSchedule`` too).
    """
    if not has_learning_rate(opt_state):
        raise ValueError(
            "the optimizer's learning rate cannot be changed: build it with "
            "optax.inject_hyperparams, e.g. optimizer=optax.inject_hyperparams(optax.adam)"
            "(learning_rate=1e-3)"
        )
    if any(_scheduled(node) for node in _states(opt_state)):
        raise TypeError(
            "the optimizer's learning rate is an optax schedule, which sets it at every step: "
            "it cannot be set from outside (LearningRateScheduler, ReduceLROnPlateau). Either "
            "keep the schedule and drop the callback, or give inject_hyperparams a number as "
            "learning_rate and let the callback change it"
        )

    def replace(node: Any) -> Any:
        if not _injected(node):
            return node
        old = node.hyperparams[_KEY]
        new = jnp.asarray(value, dtype=jnp.result_type(old))
        if isinstance(old, jax.Array):
            new = jax.device_put(new, old.sharding)
        return node._replace(hyperparams={**node.hyperparams, _KEY: new})

    return jax.tree_util.tree_map(replace, opt_state, is_leaf=_injected)
