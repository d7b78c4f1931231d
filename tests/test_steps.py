"""The pure core: one easyfit train step is one plain optax step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

import easyfit as ef

#: float32, the same operations in another order of reduction (XLA may fuse differently).
RTOL, ATOL = 1e-5, 1e-6


class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(10)(nn.relu(nn.Dense(32)(x)))


def test_one_easyfit_step_equals_one_plain_optax_step():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 6, 6, 1)).astype(np.float32)
    y = rng.integers(0, 10, 32).astype(np.int32)
    tx = optax.adam(1e-2)

    start = ef.Trainer(_MLP(), optimizer=tx, seed=0)
    start.evaluate(x, y, batch_size=32)  # creates the initial state, trains nothing
    params = jax.device_get(start.params)

    trainer = ef.Trainer(_MLP(), optimizer=tx, seed=0)
    trainer.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)  # one step
    assert int(trainer.state.step) == 1

    def loss(p):
        logits = _MLP().apply({"params": p}, jnp.asarray(x))
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    grads = jax.grad(loss)(params)
    updates, _ = tx.update(grads, tx.init(params), params)
    want = optax.apply_updates(params, updates)
    got = jax.device_get(trainer.params)
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(want), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=jax.tree_util.keystr(path))
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(got))
    )
