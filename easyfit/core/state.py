"""The training state: one small immutable pytree."""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import initial_states
from .models import example_input

if TYPE_CHECKING:
    from .sharding import StateLayout

__all__ = ["CPU_INIT_OPTIONS", "HOST_INIT_BYTES", "StateMaker", "TrainState", "inference_params"]

#: A linen model's states up to this size are initialised on the host (XLA's CPU backend) and
#: then placed on the accelerators: XLA compiles an initialisation (random draws, run once)
#: several times faster for the host than for a GPU (docs/performance.md), and a seed then gives
#: the same initial weights on every kind of machine. Larger states are initialised where they
#: will train.
HOST_INIT_BYTES = 4 << 30

#: XLA's options for an initialisation compiled for a CPU device (the host's, or the only one):
#: LLVM's first optimisation level compiles it 2-4 times sooner than the default level, and the
#: program runs once. The values are bitwise those of the default level (tested over linen's
#: initialisers, optimizers' states and EMA: tests/test_startup.py); level 0 changes some.
CPU_INIT_OPTIONS: dict[str, Any] = {"xla_backend_optimization_level": 1}


@struct.dataclass
class TrainState:
    """Everything training changes, and nothing else (no functions: it checkpoints as arrays).

    Attributes:
        step: optimizer steps taken.
        params: the trainable parameters.
        opt_state: the optimizer's state.
        model_state: the model's other variables (linen collections such as ``batch_stats``;
            for NNX, every non-parameter variable).
        rng: the key dropout and other randomness in the train step derive from (folded with
            the step, so it never needs to change).
        dynamic_scale: the loss scale under ``precision="float16"`` (a Flax ``DynamicScale``),
            else None.
        ema_params: the exponential moving average of ``params`` under
            ``Trainer(ema_momentum=)`` (``easyfit.core.steps.with_ema``), else None: what
            evaluation, prediction and export use (:func:`inference_params`).
    """

    step: jax.Array
    params: Any
    opt_state: Any
    model_state: Any
    rng: jax.Array
    dynamic_scale: Any = None
    ema_params: Any = None

    if TYPE_CHECKING:  # added by flax.struct.dataclass

        def replace(self, **updates: Any) -> TrainState: ...


class StateMaker:
    """Makes fresh TrainStates: one jitted program initialises the model, the optimizer's state
    and the moving average together, traced once for both its abstract and its concrete use
    (``jax.jit``'s trace cache: :meth:`abstract` then :meth:`make` trace the model once).

    Args:
        adapter: the model's ``easyfit.core.models.ModelAdapter``.
        tx: the optimizer.
        ema: keep a moving average of the parameters (``ema_params``), starting as a copy of
            them.
        host: the device states of at most :data:`HOST_INIT_BYTES` are computed on; ``"auto"``:
            the host's CPU device when the default backend is an accelerator, else none (where
            the default device is).
    """

    def __init__(
        self,
        adapter: Any,
        tx: optax.GradientTransformation,
        ema: bool = False,
        host: jax.Device | None | Literal["auto"] = "auto",
    ):
        self.adapter, self.tx, self.ema = adapter, tx, ema
        self._host_choice = host
        self._init = jax.jit(self._fresh)
        # the same trace (jax.jit's trace cache is the function's), compiled for a CPU device
        self._init_cpu = jax.jit(self._fresh, compiler_options=CPU_INIT_OPTIONS)

    def _fresh(self, init_rng: jax.Array, train_rng: jax.Array, variables: Any) -> TrainState:
        if self.adapter.kind == "nnx":
            params, model_state = jax.tree_util.tree_map(jnp.copy, variables)
        else:
            params, model_state = self.adapter.init(init_rng, variables)
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=self.tx.init(params),
            model_state=model_state,
            rng=train_rng,
            ema_params=jax.tree_util.tree_map(jnp.copy, params) if self.ema else None,
        )

    def _args(self, seed: int, shape: Any, nnx_variables: Any, abstract: bool) -> tuple[Any, ...]:
        init_rng, train_rng = jax.random.split(jax.random.PRNGKey(seed))
        # an NNX model's variables are copied (the train step donates the state's buffers,
        # never the user's); a linen model is initialised on one zero sample
        variables = nnx_variables if self.adapter.kind == "nnx" else example_input(shape, abstract)
        return init_rng, train_rng, variables

    def make(
        self,
        seed: int,
        shape: Any,
        nnx_variables: Any = None,
        dynamic_scale: Any = None,
        layout: StateLayout | None = None,
    ) -> TrainState:
        """A fresh TrainState for inputs of ``shape`` (one sample's: a shape, or a dict or list
        of shapes for several inputs, see ``easyfit.core.models.input_spec``). ``seed``
        seeds the initialisation (linen) and the training RNG key; ``nnx_variables``: an NNX
        model's ``(params, model_state)``; ``dynamic_scale``: the loss scale
        (``precision="float16"``), or None.

        A linen model's state of at most :data:`HOST_INIT_BYTES` is computed on the ``host``
        device (on an accelerator, by default: the host's CPU) and returned on the default device,
        uncommitted, as one computed there would be (``placement.replicate`` then places it
        on every device, across processes too).

        With a sharded ``layout`` (``easyfit.core.sharding``), a state made on the devices is
        made sharded (one program with its out-shardings: no array whole on one device first),
        and one made on the host or read back from the kept states is placed shard by shard.
        A state sharded across processes is kept and read per process, each its own shards."""
        host = self._host_device()
        # an NNX model's variables exist already, where the user made them: copied there
        linen = self.adapter.kind != "nnx"
        on_host = host is not None and linen and self._on_host(seed, shape, nnx_variables)
        where = host if on_host else None
        cpu = (where.platform if where is not None else jax.default_backend()) == "cpu"
        init = self._init_cpu if cpu else self._init
        shardings = None
        if layout is not None and layout.sharded:
            shardings = layout.shardings(self.abstract(seed, shape, nnx_variables))
        with _default_device(where):  # as abstract: the same trace
            args = self._args(seed, shape, nnx_variables, False)
            if shardings is not None and not on_host:
                args = _sharded_args(args, shardings, linen)
            # a linen model's state made on a CPU is kept, and read back by an unchanged re-run
            kept = linen and cpu and initial_states.folder() is not None
            device = where or jax.local_devices()[0]
            if kept and shardings is not None and not on_host and _across_processes(shardings):
                return self._kept_shards(init, args, device, shardings).replace(dynamic_scale=dynamic_scale)
            key, state = self._kept(init, args, device) if kept else (None, None)
            if state is None:
                state = init(*args) if shardings is None or on_host else self._sharded(shardings)(*args)
                leaves = jax.tree_util.tree_leaves(state)
                if key is not None and all(leaf.is_fully_addressable for leaf in leaves):
                    initial_states.write(key, [np.asarray(leaf) for leaf in leaves])
            elif not on_host:  # read back: placed on the default device as a computed one
                state = jax.device_put(state, shardings)
        if on_host:
            state = jax.device_put(jax.tree_util.tree_map(np.asarray, state), shardings)
        return state.replace(dynamic_scale=dynamic_scale)

    def _sharded(self, shardings: Any) -> Any:
        """The initialisation jitted to return its arrays placed by ``shardings`` (the same
        trace: the values are those of the unsharded program, JAX's random bits being
        partitionable)."""
        return jax.jit(self._fresh, out_shardings=shardings)

    def _kept(self, init: Any, args: tuple[Any, ...], device: jax.Device) -> tuple[str | None, Any]:
        """``(key, state)``: the key of the state ``init(*args)`` gives on ``device`` (a CPU)
        and that state as host arrays when one is kept (else None); no key for a state with
        PRNG key arrays (not kept)."""
        shapes = init.eval_shape(*args)  # jax.jit's trace cache: no new trace
        leaves, treedef = jax.tree_util.tree_flatten(shapes)
        if any(jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) for leaf in leaves):
            return None, None
        key = initial_states.state_key(init.trace(*args), args, device, CPU_INIT_OPTIONS)
        kept = initial_states.read(key, leaves)
        return key, None if kept is None else jax.tree_util.tree_unflatten(treedef, kept)

    def _kept_shards(self, init: Any, args: tuple[Any, ...], device: jax.Device, shardings: Any) -> Any:
        """The state ``init(*args)`` gives, sharded across processes as ``shardings`` say: each
        process keeps the shards its devices hold (one entry, keyed by the state's key and
        those shards' bounds) and reads them back, all processes or none (a process that has
        no entry, or a damaged one, has them all compute the state: one program for all)."""
        shapes = init.eval_shape(*args)  # jax.jit's trace cache: no new trace
        leaves, treedef = jax.tree_util.tree_flatten(shapes)
        places = jax.tree_util.tree_leaves(shardings)
        if any(jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) for leaf in leaves):
            return self._sharded(shardings)(*args)  # not kept, as a whole state with such keys
        # the distinct parts of each array this process holds, in device order
        pieces = [
            (i, bounds)
            for i, (leaf, place) in enumerate(zip(leaves, places, strict=True))
            for bounds in dict.fromkeys(
                _bounds(index, leaf.shape)
                for index in place.addressable_devices_indices_map(leaf.shape).values()
            )
        ]
        whole = initial_states.state_key(init.trace(*args), args, device, CPU_INIT_OPTIONS)
        key = initial_states.shard_key(whole, pieces)
        specs = [
            jax.ShapeDtypeStruct(tuple(stop - start for start, stop in bounds), leaves[i].dtype)
            for i, bounds in pieces
        ]
        kept = initial_states.read(key, specs)
        everywhere = _in_every_process(kept is not None)  # every process asks, whatever it read
        if kept is not None and everywhere:
            held = dict(zip(pieces, kept, strict=True))

            def part(i: int, shape: tuple[int, ...], index: tuple[slice, ...]) -> np.ndarray:
                return held[i, _bounds(index, shape)]

            return jax.tree_util.tree_unflatten(
                treedef,
                [
                    jax.make_array_from_callback(leaf.shape, place, functools.partial(part, i, leaf.shape))
                    for i, (leaf, place) in enumerate(zip(leaves, places, strict=True))
                ],
            )
        state = self._sharded(shardings)(*args)
        computed = jax.tree_util.tree_leaves(state)
        shards = {
            (i, _bounds(shard.index, leaf.shape)): shard.data
            for i, leaf in enumerate(computed)
            for shard in leaf.addressable_shards
        }
        initial_states.write(key, [np.asarray(shards[piece]) for piece in pieces])
        return state

    def abstract(
        self, seed: int, shape: Any, nnx_variables: Any = None, dynamic_scale: Any = None
    ) -> TrainState:
        """:meth:`make`'s shapes and dtypes (``jax.ShapeDtypeStruct`` leaves), computing
        nothing."""
        with _default_device(self._host_device()):
            state = self._init.eval_shape(*self._args(seed, shape, nnx_variables, True))
        return state.replace(dynamic_scale=dynamic_scale)

    def _on_host(self, seed: int, shape: Any, nnx_variables: Any) -> bool:
        """Whether a state is small enough to be made on the host's device."""
        leaves = jax.tree_util.tree_leaves(self.abstract(seed, shape, nnx_variables))
        return sum(leaf.size * leaf.dtype.itemsize for leaf in leaves) <= HOST_INIT_BYTES

    def _host_device(self) -> jax.Device | None:
        """``host`` as given, or for ``"auto"`` the CPU device when the default backend is
        another (and JAX has its CPU backend); asked when first needed, not at construction
        (the accelerator's runtime may still be starting)."""
        if self._host_choice != "auto":
            return self._host_choice
        if jax.default_backend() == "cpu":
            return None
        try:
            return jax.local_devices(backend="cpu")[0]
        except RuntimeError:  # JAX_PLATFORMS leaves the host's backend out
            return None


def _sharded_args(args: tuple[Any, ...], shardings: TrainState, linen: bool) -> tuple[Any, ...]:
    """The initialisation's arguments for a sharded state: an NNX model's variables placed
    shard by shard as its state will hold them (a jitted function cannot take arrays of one
    device and return arrays of the mesh); a linen model's zero input replicated."""
    init_rng, train_rng, variables = args
    mesh = jax.tree_util.tree_leaves(shardings)[0].mesh
    replicated = NamedSharding(mesh, P())
    if linen:
        return jax.device_put((init_rng, train_rng, variables), replicated)
    placed = jax.device_put(variables, (shardings.params, shardings.model_state))
    return jax.device_put(init_rng, replicated), jax.device_put(train_rng, replicated), placed


def _across_processes(shardings: Any) -> bool:
    """Whether a state placed by ``shardings`` has arrays whose shards other processes hold."""
    return not all(s.is_fully_addressable for s in jax.tree_util.tree_leaves(shardings))


def _bounds(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """A shard's ``index`` (slices, as a sharding gives them) as ``(start, stop)`` per dimension."""
    return tuple(part.indices(size)[:2] for part, size in zip(index, shape, strict=True))


def _in_every_process(ok: bool) -> bool:
    """Whether ``ok`` holds in every process (each process asks; all get the same answer)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))


def _default_device(device: jax.Device | None) -> contextlib.AbstractContextManager[Any]:
    """``jax.default_device(device)``; nothing when ``device`` is None."""
    return jax.default_device(device) if device is not None else contextlib.nullcontext()


def inference_params(state: TrainState) -> Any:
    """The parameters evaluation, prediction and export use: the moving average
    (``ema_params``) when the state keeps one, else ``params``."""
    return state.params if state.ema_params is None else state.ema_params
