"""Checkpoints with Orbax: the training state, where training stands, and nothing pickled.

A checkpoint is a directory written by Orbax's composite handler with these items:

* ``state``: the whole ``TrainState`` (step, parameters, optimizer state,
  model state, the dropout RNG key), as arrays (``weights`` instead, holding ``params`` and
  ``model_state`` only, for a weights-only checkpoint: the weights evaluation uses, the moving
  average under ``ema_momentum``);
* ``epoch_metrics``: the epoch's metric accumulator, when the checkpoint was taken mid-epoch;
* ``ema_params``: the parameters' moving average, for a trainer with ``ema_momentum`` (kept
  apart from ``state`` too: a checkpoint without it loads into such a trainer, the average then
  starting from the parameters, and one with it loads into any trainer);
* ``loss_scale``: the dynamic loss scale, for a trainer with ``precision="float16"`` (kept apart
  from ``state``, so that a checkpoint loads into a trainer of any precision: parameters are
  float32 under every precision);
* ``metadata``: JSON: the epoch and the batch reached, the train loader's position, the seed,
  the input shape, the class names, the batching plan, the optimizer (its name, or its
  state's layout) and the input recipe of the training data (``recipe``: image size, colour
  mode, scale, normalisation, evaluation's resize and crop, class names; the structure of
  array inputs: ``easyfit.data.recipe``) and, in a backup, the callbacks' states
  (``Callback.get_state``), readable in ``<path>/metadata/metadata``;
* ``callback_arrays``: in a backup, arrays callbacks keep (``EarlyStopping``'s best weights),
  by callback;
* ``checksums``: JSON: a hash of every array of the other items and of the metadata, checked
  at load time (a mismatch, or an item that cannot be read, raises CheckpointError naming the
  path and the item).

``save`` writes the new checkpoint into a staging directory it makes and marks
(``.easyfit-tmp-<hash>`` beside ``path``), moves it beside the old one (``<path>.easyfit-new``)
and swaps it in by directory renames, holding ``<path>.lock`` against a second writer. Each
checkpoint carries the marker file ``EASYFIT_CHECKPOINT``; ``save`` replaces only a directory
that carries it (or an easyfit checkpoint written before the marker, known by its
``metadata`` item) or an empty one, and refuses anything else at ``path``. A process killed
while saving leaves the previous checkpoint or the complete new one beside it (which loading
finds), never a checkpoint that loads as something else. Restored arrays take
the shardings of the target state. The functions work on plain values (a state, a
:class:`Progress`, a dict of metadata); ``Trainer.save``/``load`` call them.

Example:
    >>> import optax, tempfile, easyfit as ef
    >>> tmp = tempfile.mkdtemp()
    >>> from flax import linen as nn
    >>> root = ef.datasets.sample_folder(tmp + "/mnist-ckpt", limit=(200, 100))
    >>> def model():
    ...     return nn.Sequential([lambda x: x.reshape((x.shape[0], -1)), nn.Dense(10)])
    >>> trainer = ef.Trainer(model(), optimizer=optax.adam(1e-3), seed=0)
    >>> _ = trainer.fit(root, epochs=1, batch_size=50, verbose=0)
    >>> path = trainer.save(tmp + "/ckpt")
    >>> again = ef.Trainer.from_checkpoint(path, model(), optimizer=optax.adam(1e-3))
    >>> ef.checkpoint.read_metadata(path)["epoch"], int(again.state.step)
    (1, 4)
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from .._lazy import lazy_module
from ..core.precision import get_precision
from ..core.state import inference_params
from ..errors import CheckpointError
from . import checkpoint_files as _integrity
from .fingerprint import fingerprint_changes

if TYPE_CHECKING:
    import orbax.checkpoint as ocp

    from ..data.plan import Plan
else:  # imported when a checkpoint is first written or read
    ocp = lazy_module("orbax.checkpoint")

__all__ = [
    "Progress",
    "ResumePoint",
    "checkpoint_args",
    "read_metadata",
    "reader",
    "restore",
    "save",
    "verify",
]

FORMAT = _integrity.FORMAT
#: 2: with checksums (version 1 checkpoints load unchecked).
VERSION = 2
#: Plan fields that give a loader position its meaning (the number of devices does not).
_PLAN_KEYS = ("num_samples", "batch_size", "shuffle", "seed", "steps_per_execution", "epoch_steps")


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where a fit stands.

    Attributes:
        epoch: the epoch in progress, or the next one to run when ``batch`` is 0.
        batch: dispatches of that epoch already trained.
        position: the training loader's position (``Loader.position()``), opaque JSON.
        metrics: the epoch's metric accumulator (a clu Collection) when ``batch > 0``.
        plan: the training data's batching plan.
    """

    epoch: int
    batch: int = 0
    position: Mapping[str, Any] | None = None
    metrics: Any = None
    plan: Plan | None = None


def _abstract(tree: Any) -> Any:
    return jax.tree_util.tree_map(
        lambda a: a if isinstance(a, jax.ShapeDtypeStruct) else ocp.utils.to_shape_dtype_struct(a), tree
    )


def _plan_json(plan: Plan | None) -> dict | None:
    if plan is None:
        return None
    windows = getattr(plan, "windows", None)  # a shuffle by windows of blocks: its size and blocks
    return {
        **{k: getattr(plan, k) for k in _PLAN_KEYS},
        "windows": None if windows is None else windows.key(),
    }


def _metadata(state: Any, progress: Progress | None, meta: Mapping[str, Any], kind: str) -> dict[str, Any]:
    progress = progress or Progress(0)
    return {
        "format": FORMAT,
        "version": VERSION,
        "kind": kind,
        "epoch": progress.epoch,
        "batch": progress.batch,
        "position": dict(progress.position or {}) or None,
        "step": int(np.asarray(jax.device_get(state.step))),
        "seed": meta.get("seed"),
        "input_shape": meta.get("input_shape"),
        "input_dtype": meta.get("input_dtype"),
        "input_scale": meta.get("input_scale"),
        "class_names": meta.get("class_names"),
        "plan": _plan_json(progress.plan),
        "has_metrics": kind == "full" and progress.metrics is not None,
        "has_ema": kind == "full" and getattr(state, "ema_params", None) is not None,
        "precision": meta.get("precision", "float32"),
        "data": meta.get("data"),
        "optimizer": meta.get("optimizer"),
        "recipe": meta.get("recipe"),
        "callbacks": meta.get("callbacks"),
    }


def checkpoint_args(
    state: Any,
    progress: Progress | None,
    meta: Mapping[str, Any],
    *,
    weights_only: bool = False,
    callback_arrays: Mapping[str, Any] | None = None,
) -> ocp.args.Composite:
    """The Orbax save arguments for a training state, where training stands and ``meta``
    (``seed``, ``input_shape``, ``input_dtype``, ``class_names``, a backup's ``callbacks``),
    and the arrays callbacks keep (a backup's ``callback_arrays``, by callback)."""
    full = _metadata(state, progress, meta, "weights" if weights_only else "full")
    trees: dict[str, Any] = {}
    if weights_only:
        trees["weights"] = {"params": inference_params(state), "model_state": state.model_state}
    else:
        trees["state"] = _state_item(state)
        if state.ema_params is not None:
            trees["ema_params"] = state.ema_params
        if state.dynamic_scale is not None:
            trees["loss_scale"] = state.dynamic_scale
        if full["has_metrics"]:  # only with a progress
            assert progress is not None
            trees["epoch_metrics"] = progress.metrics
        if callback_arrays:
            trees["callback_arrays"] = dict(callback_arrays)
    sums = {
        "metadata": _integrity.json_digest(full),
        "items": {name: _integrity.digests(tree) for name, tree in trees.items()},
    }
    return ocp.args.Composite(
        metadata=ocp.args.JsonSave(full),
        **{_integrity.ITEM: ocp.args.JsonSave(sums)},
        **{name: ocp.args.StandardSave(tree) for name, tree in trees.items()},
    )


def _checkpointer() -> ocp.Checkpointer:
    return ocp.Checkpointer(ocp.CompositeCheckpointHandler())


def save(
    path: str | os.PathLike,
    state: Any,
    progress: Progress | None,
    meta: Mapping[str, Any],
    *,
    weights_only: bool = False,
) -> str:
    """Writes a checkpoint of ``state`` at ``path`` (replacing one already there).

    Args:
        path: the checkpoint's directory.
        state: a :class:`~easyfit.core.state.TrainState`.
        progress: where training stands (epoch, batch, loader position, metrics, plan).
        meta: ``seed``, ``input_shape``, ``input_dtype``, ``class_names``, ``recipe``, ...
            (JSON values: ``Trainer.checkpoint_meta``).
        weights_only: save the parameters and model state only.

    The new checkpoint is written beside the old one (``<path>.easyfit-new``) and swapped in
    by directory renames once complete (by process 0, after every process wrote its part), so a
    complete checkpoint exists at every instant. ``<path>.lock`` keeps a second writer out.

    Only an easyfit checkpoint (or an empty directory) at ``path`` is replaced; any path works,
    ``[``, ``]``, spaces and non-ASCII names included (the checkpoint is written where Orbax
    can take it, then renamed).

    Raises:
        CheckpointError: another program is saving at ``path``; or ``path`` (or
            ``<path>.easyfit-new``/``-old``) is a file, a link, or a directory that is not an
            easyfit checkpoint (nothing is written).

    Returns:
        The absolute path written.
    """
    path = os.path.abspath(os.fspath(path))
    _integrity.check_target(path)
    args = checkpoint_args(state, progress, meta, weights_only=weights_only)
    main = jax.process_index() == 0
    with _integrity.WriterLock(path):
        if main:
            _integrity.check_target(path)  # again, holding the lock
            _integrity.recover(path)
            _integrity.stage(path)
        _sync("easyfit-checkpoint-recovered")
        with _checkpointer() as checkpointer:
            checkpointer.save(_integrity.staged(path), args=args)
        _sync("easyfit-checkpoint-written")
        if main:
            _integrity.swap_in(path)
        _sync("easyfit-checkpoint-swapped")
    return path


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _check_shapes(path: str, name: str, args: Any) -> None:
    """Raises CheckpointError naming the first array of item ``name`` whose saved shape is not
    the target's, or that the checkpoint lacks, before anything is read.

    Orbax reads an item's arrays concurrently in an event loop that it closes at the first
    failed read; the reads still in flight then end in that closed loop and print tracebacks
    ("Event loop is closed", TensorStore specs) long after the error was raised. A checkpoint of
    another model fails this way; checked here, from the item's metadata, no read starts.
    """
    from etils import epath  # type: ignore[import-untyped]  # Orbax requires etils

    target = getattr(args, "item", None)
    if target is None:
        return
    handler = ocp.PyTreeCheckpointHandler()
    try:
        saved = handler.metadata(epath.Path(path) / name)
    except Exception:  # unreadable metadata: the read that follows says so
        return
    finally:
        handler.close()
    have = ocp.tree.to_flat_dict(getattr(saved, "tree", saved))
    wanted = ocp.tree.to_flat_dict(ocp.tree.serialize_tree(target, keep_empty_nodes=True))
    for key in sorted(wanted, key=lambda k: k[0] != "params"):  # the parameters' name first
        want = wanted[key]
        if not hasattr(want, "shape"):
            continue
        where = "/".join(str(k) for k in key)
        if key not in have:
            raise CheckpointError(
                f"{path}: item {name!r} has no array {where} (saved from another model or optimizer)"
            )
        shape = getattr(have[key], "shape", None)
        dtype = getattr(want, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            want = jax.eval_shape(jax.random.key_data, want)  # a key is saved as its key data
        if shape is not None and tuple(shape) != tuple(want.shape):
            raise CheckpointError(
                f"{path}: item {name!r} was saved from another model: {where} has shape "
                f"{tuple(shape)} in the checkpoint, {tuple(want.shape)} in this trainer's model"
            )


def _read(path: str, name: str, args: Any) -> Any:
    """Item ``name`` of the checkpoint at ``path``; any failure a CheckpointError naming both."""
    _check_shapes(path, name, args)
    try:
        with _checkpointer() as checkpointer:  # closed: no Orbax thread outlives the read
            return checkpointer.restore(path, args=ocp.args.Composite(**{name: args}))[name]
    except CheckpointError:
        raise
    except Exception as e:  # TensorStore, JSON, pytree structure: all say "cannot be read"
        why = (str(e).strip().splitlines() or [""])[0][:300]
        raise CheckpointError(
            f"{path}: item {name!r} cannot be read (the checkpoint is damaged, "
            f"or was saved from another model or optimizer): "
            f"{type(e).__name__}: {why}"
        ) from e


def _checksums(path: str, meta: Mapping[str, Any]) -> dict[str, Any] | None:
    if meta.get("version", 1) < 2:
        return None  # written before checksums
    if not os.path.isdir(os.path.join(path, _integrity.ITEM)):
        raise CheckpointError(f"{path}: item {_integrity.ITEM!r} is missing, the checkpoint is damaged")
    sums = _read(path, _integrity.ITEM, ocp.args.JsonRestore())
    if not isinstance(sums, dict) or not isinstance(sums.get("items"), dict):
        raise CheckpointError(f"{path}: item {_integrity.ITEM!r} is damaged")
    return sums


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON metadata of the checkpoint at ``path``.

    Raises:
        CheckpointError: ``path`` is not a complete easyfit checkpoint (missing, or a
            temporary directory left by a save that did not finish).
    """
    path = _integrity.resolve(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if ocp.utils.TMP_DIR_SUFFIX in os.path.basename(path) or (
        path.endswith(_integrity.NEW) and not _integrity.complete(path)
    ):
        raise CheckpointError(f"{path}: an unfinished checkpoint (a save was interrupted)")
    if not os.path.isdir(os.path.join(path, "metadata")):
        raise CheckpointError(f"{path}: not an easyfit checkpoint (no metadata item)")
    meta = _read(path, "metadata", ocp.args.JsonRestore())
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an easyfit checkpoint")
    sums = _checksums(path, meta)
    if sums is not None and _integrity.json_digest(meta) != sums.get("metadata"):
        raise CheckpointError(f"{path}: item 'metadata' does not match its checksum (edited or damaged)")
    return meta


Reader = Callable[["ocp.args.Composite"], Mapping[str, Any]]


def reader(path: str | os.PathLike) -> Reader:
    """Reads the given Orbax items of the checkpoint at ``path``, each checked against the
    checksums written with it (a mismatch raises CheckpointError naming the item and array)."""
    path = _integrity.resolve(os.path.abspath(os.fspath(path)))

    def read(args: ocp.args.Composite) -> dict[str, Any]:
        meta = read_metadata(path)
        sums = _checksums(path, meta)
        got = {}
        for name, item in args.items():
            got[name] = _read(path, name, item)
            if sums is not None:
                if name not in sums["items"]:
                    raise CheckpointError(f"{path}: item {name!r} has no checksums")
                _integrity.check(path, name, got[name], sums["items"][name])
        return got

    return read


def verify(path: str | os.PathLike) -> dict[str, Any]:
    """Reads every array of the checkpoint at ``path`` (as NumPy, on any devices) and checks it
    against its checksum; returns the metadata.

    Raises:
        CheckpointError: naming the path and the part (item, array) that is damaged, missing or
            edited.
    """
    path = _integrity.resolve(os.path.abspath(os.fspath(path)))
    meta = read_metadata(path)
    sums = _checksums(path, meta)
    for name, saved in (sums or {"items": {}})["items"].items():
        try:
            with ocp.PyTreeCheckpointer() as checkpointer:
                tree = checkpointer.metadata(os.path.join(path, name))
            tree = getattr(tree, "item_metadata", tree)
            tree = getattr(tree, "tree", tree)
            as_numpy = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        except Exception as e:
            raise CheckpointError(
                f"{path}: item {name!r} cannot be read (the checkpoint is damaged): {type(e).__name__}: {e}"
            ) from e
        got = _read(path, name, ocp.args.PyTreeRestore(restore_args=as_numpy))
        _integrity.check(path, name, got, saved, every=True)
    return meta


def restore(
    read: Reader,
    target: Any,
    meta: Mapping[str, Any],
    metrics_template: Any = None,
    *,
    weights_only: bool = False,
) -> tuple[Any, Any]:
    """The state (and mid-epoch metric accumulator) of a checkpoint.

    Args:
        read: reads the given Orbax items of one checkpoint (:func:`reader`, or a manager's
            step).
        target: the state whose structure, shapes and shardings are restored to (arrays or
            ``jax.ShapeDtypeStruct``); a weights-only checkpoint replaces its parameters and
            model state, so it must hold arrays.
        meta: the checkpoint's metadata (:func:`read_metadata`).
        metrics_template: an empty metric accumulator, to restore a mid-epoch one.
        weights_only: restore the parameters, the model state and the step alone, also from
            a full checkpoint (for inference: the optimizer state may be of another layout);
            ``target`` must then hold arrays.

    Returns:
        ``(state, metrics or None)``.
    """
    if meta["kind"] == "full" and weights_only:
        part = {"step": target.step, "params": target.params, "model_state": target.model_state}
        restore_args = jax.tree_util.tree_map(
            lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding, global_shape=a.shape, dtype=a.dtype), part
        )
        item = ocp.args.PyTreeRestore(_abstract(part), restore_args=restore_args, partial_restore=True)
        got = read(ocp.args.Composite(state=item))["state"]
        return _with_average(target.replace(**{k: got[k] for k in part}), read, meta), None
    if meta["kind"] == "weights":
        weights = {"params": target.params, "model_state": target.model_state}
        got = read(ocp.args.Composite(weights=ocp.args.StandardRestore(_abstract(weights))))
        return _with_average(target.replace(**got["weights"]), read, meta), None
    items = {"state": ocp.args.StandardRestore(_abstract(_state_item(target)))}
    if meta.get("has_metrics") and metrics_template is not None:
        items["epoch_metrics"] = ocp.args.StandardRestore(_abstract(metrics_template))
    scaled = target.dynamic_scale is not None
    if scaled and meta.get("precision") == "float16":
        items["loss_scale"] = ocp.args.StandardRestore(_abstract(target.dynamic_scale))
    got = read(ocp.args.Composite(**items))
    scale = got.get("loss_scale")
    if scale is None and scaled:  # saved under another precision: a fresh scale
        fresh = get_precision("float16").initial_scale()
        scale = jax.tree_util.tree_map(
            lambda t, v: jax.device_put(v, t.sharding), target.dynamic_scale, fresh
        )
    state = target.replace(**{**got["state"], "dynamic_scale": scale})
    return _with_average(state, read, meta), got.get("epoch_metrics")


#: The TrainState fields of the ``state`` item, as every checkpoint since the first holds them.
_STATE_FIELDS = ("step", "params", "opt_state", "model_state", "rng", "dynamic_scale")


def _state_item(state: Any) -> dict[str, Any]:
    """The ``state`` item of a TrainState: its fields as a dict (as Orbax stores a dataclass),
    without the loss scale (None) and the moving average (items of their own), so that a field
    added to TrainState later does not change the item's structure."""
    return {name: None if name == "dynamic_scale" else getattr(state, name) for name in _STATE_FIELDS}


def _with_average(state: Any, read: Reader, meta: Mapping[str, Any]) -> Any:
    """``state`` (restored, its ``ema_params`` the target's) with the checkpoint's moving
    average when both keep one; from a checkpoint without one, a copy of the restored
    parameters (the average starts there)."""
    if state.ema_params is None:
        return state
    if meta.get("has_ema"):
        item = ocp.args.StandardRestore(_abstract(state.ema_params))
        return state.replace(ema_params=read(ocp.args.Composite(ema_params=item))["ema_params"])
    return state.replace(ema_params=jax.tree_util.tree_map(jnp.copy, state.params))


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a fit should resume, offered by a callback's ``restore_point()``.

    ``fit`` asks each callback that has a ``restore_point()`` method, before it builds the
    training loader; the first one that returns a ResumePoint wins. fit then starts the loader at
    ``position``, the epoch loop at ``(epoch, batch)``, and calls ``restore`` once the
    state exists.
    """

    epoch: int
    batch: int
    position: Mapping[str, Any] | None
    meta: Mapping[str, Any]
    read: Reader
    source: str = "checkpoint"

    def check(self, plan: Plan) -> None:
        """Raises ValueError if the checkpoint's batching plan differs from ``plan`` (its
        loader position would then mean other samples)."""
        saved = self.meta.get("plan")
        now = _plan_json(plan)
        assert now is not None
        if saved is None:
            return
        changed = [k for k in (*_PLAN_KEYS, "windows") if saved.get(k) != now[k]]
        if changed:  # a key older checkpoints lack (epoch_steps, windows) reads as its default, None
            names = {"epoch_steps": "steps_per_epoch", "windows": "shuffle windows [size, blocks]"}
            diff = ", ".join(f"{names.get(k, k)}: {saved.get(k)} -> {now[k]}" for k in changed)
            raise ValueError(
                f"{self.source}: cannot resume exactly, the training data or its "
                f"batching changed ({diff}); delete the backup to start afresh"
            )

    def check_data(self, fingerprint: Mapping[str, Any]) -> None:
        """Raises ValueError naming what differs between the data the backup was taken on and
        ``fingerprint`` (``easyfit.persistence.fingerprint.data_fingerprint`` of the data fit
        has now). A backup written before fingerprints were recorded is not checked."""
        saved = self.meta.get("data")
        diff = fingerprint_changes(saved, fingerprint) if saved else None
        if diff:
            raise ValueError(
                f"{self.source}: cannot resume, the training data is not the data the backup was "
                f"taken on ({diff}); train on the same data, or delete the backup to start afresh"
            )

    def restore(self, target: Any, metrics_template: Any) -> tuple[Any, Any]:
        """``(state, the epoch's metric accumulator)`` restored onto ``target``'s structure."""
        return restore(self.read, target, self.meta, metrics_template)

    def read_item(self, name: str, target: Any) -> Any:
        """Item ``name`` of the checkpoint (``callback_arrays``), restored onto ``target``'s
        structure, shapes and shardings, checked against its checksums."""
        return self.read(ocp.args.Composite(**{name: ocp.args.StandardRestore(_abstract(target))}))[name]


def fit_completed(callbacks: Iterable[Any]) -> None:
    """Deprecated: ``fit`` tells its callbacks itself, by the resume protocol declared on
    ``Callback`` (:class:`easyfit.callbacks.Resumable`); a program that drives callbacks by
    hand calls ``cb.fit_completed()`` on each that is ``Resumable``. Kept for one release,
    with a DeprecationWarning.

    Tells each callback that has a ``fit_completed()`` method that fit returned normally
    (every ``on_train_end`` ran without an error): a backup may now be deleted."""
    _deprecated("fit_completed", "call cb.fit_completed() on each callback cb that is Resumable")
    _fit_completed(callbacks)


def find_resume_point(callbacks: Any) -> ResumePoint | None:
    """Deprecated: ``fit`` asks its callbacks itself, by the resume protocol declared on
    ``Callback`` (:class:`easyfit.callbacks.Resumable`); a program that drives callbacks by
    hand asks ``cb.restore_point()`` of each that is ``Resumable``. Kept for one release,
    with a DeprecationWarning.

    The first ResumePoint offered by a callback's ``restore_point()`` method, if any."""
    _deprecated("find_resume_point", "ask cb.restore_point() of each callback cb that is Resumable")
    return _find_resume_point(callbacks)


def _deprecated(name: str, instead: str) -> None:
    warnings.warn(
        f"easyfit.checkpoint.{name} is deprecated and will be removed in the next release: fit "
        f"follows the resume protocol of easyfit.callbacks.Resumable itself; to do it by hand, {instead}",
        DeprecationWarning,
        stacklevel=3,
    )


def _fit_completed(callbacks: Iterable[Any]) -> None:
    """Tells each callback that has a ``fit_completed()`` method that fit returned normally."""
    for cb in callbacks:
        done = getattr(cb, "fit_completed", None)
        if callable(done):
            done()


def _find_resume_point(callbacks: Any) -> ResumePoint | None:
    """The first ResumePoint offered by a callback's ``restore_point()`` method, if any."""
    for cb in callbacks:
        offer = getattr(cb, "restore_point", None)
        point = offer() if callable(offer) else None
        if point is not None:
            return point
    return None
