"""easyfit's internals that tests read or set, in one place.

Tests go through the public API. A few check what no public API shows: which DALI pipelines a
loader built, how often a step function compiled, a loader thread as on GPU machines, what
``Trainer.close`` releases. They use these functions, so that when an internal is renamed this
file changes and the tests do not. Add a function here rather than reaching into a private
attribute from a test, unless the test's subject is that private code itself.
"""

from __future__ import annotations

from typing import Any


def thread_the_loader(trainer: Any, **options: Any) -> None:
    """Makes ``trainer``'s training loaders run as on a GPU machine: in a background thread
    that builds the pipelines and declares the first chunk's shapes early. ``options`` are more
    loader options (``pipelines_per_device=2``)."""
    import dataclasses

    data = trainer._data
    data.loader_options = dataclasses.replace(data.loader_options, threaded=True, **options)


def step_functions(trainer: Any) -> Any:
    """The one training configuration ``trainer`` compiled (``fns.train(k)`` for k steps a
    dispatch, ``fns.eval``)."""
    (fns,) = trainer._steps.configurations()
    return fns


def compilations(fn: Any) -> int:
    """How many programs the jitted ``fn`` compiled (JAX's own count)."""
    return int(fn._cache_size())


def holds_compiled_steps(trainer: Any) -> bool:
    """Whether ``trainer`` keeps any compiled step (``Trainer.close`` forgets them)."""
    steps = trainer._steps
    return bool(steps.configurations() or steps._predict)


def kept_streams(trainer: Any) -> dict:
    """The evaluation and prediction streams ``trainer`` keeps between passes (the dict itself:
    ``Trainer.close`` empties it)."""
    return trainer._data._kept._streams


def model_adapter(trainer: Any) -> Any:
    """The adapter through which ``trainer`` calls its model (``easyfit.core.models``)."""
    return trainer._adapter


def built_pipelines(loader: Any) -> list:
    """The DALI pipelines ``loader`` has built (none before its first chunk, none once
    closed)."""
    return loader._pipelines._pipes


def declared_chunk_spec(loader: Any) -> tuple[Any, bool]:
    """``(spec, ran)``: the first chunk's shapes as the loader's pipelines give them, and
    whether their first run had happened when they did."""
    pipelines = loader._pipelines
    spec = pipelines.chunk_spec()
    return spec, pipelines._first_ran.is_set()


def runs_per_chunk(loader: Any) -> int:
    """How many runs of a reader-driven loader's pipelines make one chunk."""
    return int(loader._pipelines._unit_runs)


def init_compilations(maker: Any) -> tuple[int, int]:
    """``(cpu, default)``: programs a ``StateMaker`` compiled with the CPU's options and with
    XLA's default ones."""
    return compilations(maker._init_cpu), compilations(maker._init)


def checker_pool(source: Any) -> Any:
    """The pool of checker children of a source of one file per sample, or None before it
    started one (``easyfit.data.check_pool.CheckPool``)."""
    return getattr(source, "_checks", None)
