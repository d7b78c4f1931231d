"""fit's start-up: one jitted program initialises the parameters, the optimizer's state and
the moving average, the model traced once for it (``easyfit.core.state.StateMaker``), and
the state is the one Flax and Optax make."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from dataclasses import replace
from typing import Any

import flax
import jax
import numpy as np
import optax
import pytest
from flax import linen as nn

import easyfit as ef
from tests.helpers import flat_params


class Notes:
    """Where a Recorder counts (an object: a flax module's own fields are frozen)."""

    def __init__(self):
        self.initialising = 0
        self.inferring = 0  # traces with train=False outside the initialisation


class Recorder(nn.Module):
    """A tiny classifier that counts the times it is traced to be initialised."""

    notes: Any

    @nn.compact
    def __call__(self, x, train: bool = False):
        if self.is_initializing():
            self.notes.initialising += 1
        elif not train:
            self.notes.inferring += 1
        return nn.Dense(10)(nn.relu(nn.Dense(8)(x.reshape((x.shape[0], -1)))))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return ef.datasets.sample_folder(str(tmp_path_factory.mktemp("startup") / "mnist"), limit=(64, 32))


def test_fit_traces_the_model_once_to_initialise_it_and_makes_the_state_flax_and_optax_make(root):
    notes = Notes()
    tx = optax.adam(1e-3)
    trainer = ef.Trainer(Recorder(notes), optimizer=tx, seed=5, ema_momentum=0.9)
    trainer.fit(root + "/train", epochs=0, batch_size=32, verbose=0)  # the state alone
    assert notes.initialising == 1  # its shapes and its values from one trace
    state = trainer.state
    init_rng, train_rng = jax.random.split(jax.random.PRNGKey(5))
    p_rng, d_rng = jax.random.split(init_rng)  # as easyfit's linen adapter seeds init
    zeros = np.zeros((1, 28, 28, 1), np.float32)
    params = Recorder(Notes()).init({"params": p_rng, "dropout": d_rng}, zeros, train=False)["params"]
    np.testing.assert_array_equal(flat_params(state.params), flat_params(params))  # exact
    np.testing.assert_array_equal(flat_params(state.ema_params), flat_params(params))
    np.testing.assert_array_equal(flat_params(state.opt_state), flat_params(tx.init(params)))
    np.testing.assert_array_equal(np.asarray(state.rng), np.asarray(train_rng))
    assert int(state.step) == 0
    raw = [a.unsafe_buffer_pointer() for a in jax.tree_util.tree_leaves(state.params)]
    ema = {a.unsafe_buffer_pointer() for a in jax.tree_util.tree_leaves(state.ema_params)}
    assert not ema & set(raw)  # buffers of their own: the train step donates both


@pytest.mark.parametrize("limit", [None, 0])
def test_a_state_made_on_the_host_device_equals_the_default_devices_and_lands_there_uncommitted(
    monkeypatch, limit
):
    from easyfit.core.models import adapt
    from easyfit.training import state as state_module

    if limit is not None:  # a state over the limit is made where it trains
        monkeypatch.setattr(state_module, "HOST_INIT_BYTES", limit)
    notes = Notes()
    (adapter, _), tx = adapt(Recorder(notes)), optax.adam(1e-3)
    host = jax.local_devices(backend="cpu")[0]
    made = state_module.StateMaker(adapter, tx, ema=True, host=host).make(3, (28, 28, 1))
    plain = state_module.StateMaker(adapt(Recorder(Notes()))[0], tx, ema=True, host=None).make(3, (28, 28, 1))
    if limit is None:
        assert notes.initialising == 1  # the size check's shapes and the state from one trace
    for a, b in zip(jax.tree_util.tree_leaves(made), jax.tree_util.tree_leaves(plain), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # exact
        # as a jit output: replicating it over processes is no cross-host transfer
        assert a.devices() == {jax.devices()[0]} and not a.committed


class Initialisers(nn.Module):
    """linen's initialisers, a BatchNorm and an embedding: random draws of every kind an
    initialisation compiles (normal, truncated normal, uniform, orthogonal's QR)."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.BatchNorm(use_running_average=not train)(nn.Conv(6, (3, 3))(x)).reshape((x.shape[0], -1))
        inits = nn.initializers
        kernels = [inits.normal(0.3), inits.orthogonal(), inits.he_uniform(), inits.glorot_normal()]
        h = sum(nn.Dense(12, kernel_init=k, bias_init=inits.uniform(0.2))(x) for k in kernels)
        h = nn.LayerNorm()(h) + nn.Embed(50, 12)(np.zeros((1,), np.int32))
        return nn.Dense(10, param_dtype=jax.numpy.bfloat16)(h)


@pytest.mark.parametrize("model", [Recorder(Notes()), Initialisers()], ids=["dense", "initialisers"])
def test_an_initialisation_compiled_for_the_cpu_gives_the_default_compilations_values(model):
    from easyfit.core.models import adapt
    from easyfit.training import state as state_module

    tx = optax.adamw(1e-3)
    maker = state_module.StateMaker(adapt(model)[0], tx, ema=True, host=jax.local_devices(backend="cpu")[0])
    made = maker.make(7, (8, 8, 1))
    assert maker._init_cpu._cache_size() == 1 and maker._init._cache_size() == 0  # the CPU's options
    init_rng, _ = jax.random.split(jax.random.PRNGKey(7))
    p_rng, d_rng = jax.random.split(init_rng)
    zeros = np.zeros((1, 8, 8, 1), np.float32)
    variables = jax.jit(lambda r1, r2, x: model.init({"params": r1, "dropout": r2}, x, train=False))(
        p_rng, d_rng, zeros
    )  # XLA's default options
    params = variables["params"]
    for got, want in [(made.params, params), (made.ema_params, params), (made.opt_state, tx.init(params))]:
        np.testing.assert_array_equal(flat_params(got), flat_params(want))  # exact
    assert bool(made.model_state) == ("batch_stats" in variables)


@pytest.mark.parametrize("loss", [None, "sparse_categorical_crossentropy"])
def test_the_label_and_class_weight_checks_take_the_output_shapes_the_initialisation_noted(root, loss):
    notes = Notes()
    trainer = ef.Trainer(Recorder(notes), loss=loss, seed=0)
    trainer.fit(root + "/train", epochs=0, batch_size=32, verbose=0, class_weight={0: 2.0})
    assert notes.initialising == 1
    assert notes.inferring == 0  # no trace of the model for its output shapes
    adapter = trainer._adapter
    assert adapter.output_shapes(trainer.state.params, trainer.state.model_state, [28, 28, 1]) == (10,)
    assert notes.inferring == 0
    # another input shape was never initialised: traced for it (and refused by the Dense)
    with pytest.raises(flax.errors.ScopeParamShapeError):
        adapter.output_shapes(trainer.state.params, trainer.state.model_state, [14, 14, 1])
    assert notes.inferring == 1


def test_an_error_of_the_models_initialisation_is_raised_by_fit(root):
    class Broken(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            raise ValueError("the model's own error")

    with pytest.raises(ValueError, match="the model's own error"):
        ef.Trainer(Broken(), optimizer="sgd").fit(root + "/train", epochs=1, batch_size=32, verbose=0)


def _layout(tree):
    return jax.tree_util.tree_map(lambda a: (a.shape, a.dtype, a.sharding), tree)


@pytest.mark.parametrize("start", [0, 2])
def test_the_chunk_spec_of_the_first_run_is_the_chunks_layout(root, start):
    from easyfit.data.loader import Loader
    from easyfit.parallel import Placement

    placement = Placement.create()
    source = ef.data.Arrays(np.arange(96 * 3, dtype=np.float32).reshape(96, 3), np.arange(96) % 10)
    source = ef.data.Arrays(source.x, source.y, sample_weight=np.ones(96, np.float32))
    plan = ef.data.Plan(len(source), 16, seed=0, steps_per_execution=2, num_shards=placement.num_shards)
    loader = Loader(source, plan, placement, start=start, threaded=True, pipelines_per_device=2)
    try:
        spec = loader.chunk_spec()  # as the loader thread's first run gives it
        assert spec is not None and set(spec) == {"x", "y", "sample_weight", "mask"}
        assert _layout(spec) == _layout(next(loader))
        assert loader.chunk_spec() is None  # the first chunk is read: nothing ahead to tell
    finally:
        loader.close()


def test_a_fit_compiling_from_the_chunk_spec_trains_as_one_waiting_for_the_chunk(root):
    params = {}
    for threaded in (False, True):  # True: the loader thread of GPU machines, and its spec
        notes = Notes()
        trainer = ef.Trainer(Recorder(notes), optimizer="adam", seed=0, steps_per_execution=2)
        trainer._data.loader_options = replace(
            trainer._data.loader_options, threaded=threaded, pipelines_per_device=2
        )
        trainer.fit(root + "/train", epochs=2, batch_size=16, verbose=0, cache=False)
        assert notes.initialising == 1
        params[threaded] = flat_params(trainer.state.params)
    np.testing.assert_array_equal(params[True], params[False])  # bit for bit (CPU)


class _Compiles(logging.Handler):
    """The names of the functions JAX logs compiling (``jax_log_compiles``, in every thread)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Compiling "):
            self.names.append(message.split(" ")[1])


def test_the_first_step_runs_the_program_compiled_ahead_for_its_shapes(root):
    """The first chunk's step compiles in a thread, for the abstract state and accumulators,
    while the model initialises; the first call then finds that program: one compilation of it,
    with the GPU machines' loader thread (shapes from the source's declaration) or without."""
    handler = _Compiles()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):  # the main thread's setting
            jax.config.update("jax_log_compiles", True)  # and the compile thread's
            for threaded in (False, True):
                handler.names.clear()
                trainer = ef.Trainer(
                    Recorder(Notes()), optimizer="adam", metrics=["accuracy"], steps_per_execution=2
                )
                trainer._data.loader_options = replace(trainer._data.loader_options, threaded=threaded)
                trainer.fit(root + "/train", epochs=1, batch_size=16, verbose=0, cache=False)  # 4 steps
                assert handler.names.count("jit(run)") == 1, (threaded, handler.names)
    finally:
        jax.config.update("jax_log_compiles", False)
        logger.removeHandler(handler)


def test_abstract_leaves_keep_their_weak_type_as_jit_keys_on_it():
    placement = ef.parallel.Placement.create()
    tree = {"weak": jax.numpy.asarray(0.0), "strong": jax.numpy.zeros((), jax.numpy.float32)}
    for replicated in (False, True):
        out = placement.abstract(tree, replicated=replicated)
        assert (out["weak"].weak_type, out["strong"].weak_type) == (True, False)
        assert out["weak"].sharding == (placement.replicated if replicated else tree["weak"].sharding)


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> str:
    """RGB JPEGs of several sizes, in class folders."""
    out = tmp_path_factory.mktemp("photos")
    made = ef.datasets.synthetic_images(out, classes=2, per_class=(12, 2), size=(40, 90), workers=1)
    return made + "/train"


@pytest.fixture(scope="module")
def photo_targets(photos, tmp_path_factory) -> str:
    """A CSV of two float targets per photo, its paths relative to the photos' folder."""
    csv = tmp_path_factory.mktemp("targets") / "targets.csv"
    files = sorted(os.path.relpath(os.path.join(d, f), photos) for d, _, fs in os.walk(photos) for f in fs)
    csv.write_text("file,a,b\n" + "".join(f"{f},{i},{2 * i}\n" for i, f in enumerate(files)))
    return str(csv)


def _folder(root, photos, case, csv=None):
    aug = ef.data.Augment
    return {
        "csv of rgb, cropped": lambda: ef.data.ImageCSV(
            csv, root=photos, image_size=(20, 20), augment=aug(random_resized_crop=(0.5, 1.0))
        ),
        "resized grayscale": lambda: ef.data.ImageFolder(root + "/train", image_size=(20, 24)),
        "rgb normalised, cropped, flipped": lambda: ef.data.ImageFolder(
            photos,
            image_size=(32, 32),
            normalize="imagenet",
            augment=aug(random_resized_crop=(0.3, 1.0), flip=True),
        ),
        "rgb padded, rotated, brighter": lambda: ef.data.ImageFolder(
            photos,
            image_size=(24, 28),
            augment=aug(crop_padding=2, rotation=10, brightness=0.2, contrast=0.2),
        ),
        "grayscale of rgb, center crop": lambda: ef.data.ImageFolder(
            photos, image_size=(16, 16), color_mode="grayscale", normalize=(0.5, 0.2), eval_crop=0.875
        ),
    }[case]()


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize(
    "case",
    [
        "resized grayscale",
        "rgb normalised, cropped, flipped",
        "rgb padded, rotated, brighter",
        "grayscale of rgb, center crop",
        "csv of rgb, cropped",
    ],
)
def test_an_image_sources_declared_outputs_are_its_pipelines_so_the_spec_needs_no_run(
    root, photos, photo_targets, case, training
):
    from easyfit.data.loader import Loader
    from easyfit.parallel import Placement

    source = _folder(root, photos, case, photo_targets)
    assert source.output_spec() is not None
    placement = Placement.create()
    plan = ef.data.Plan(len(source), 8, seed=0, steps_per_execution=2, num_shards=placement.num_shards)
    loader = Loader(source, plan, placement, threaded=True, pipelines_per_device=2, training=training)
    try:
        spec = loader._pipelines.chunk_spec()  # from the declaration: no run waited for
        assert not loader._pipelines._first_ran.is_set()
        assert _layout(spec) == _layout(loader.chunk_spec())
        assert _layout(spec) == _layout(next(loader))  # the first run checked it too
    finally:
        loader.close()


def test_a_threaded_loader_builds_its_pipelines_in_its_thread_when_the_first_chunk_is_made(root, monkeypatch):
    """Opening the stream builds nothing: fit initialises the model and traces its first step
    from the declared spec while the loader's thread builds the pipelines (GPU machines)."""
    from nvidia.dali import Pipeline

    from easyfit.data.loader import Loader
    from easyfit.parallel import Placement

    built: list[str] = []  # the thread of each pipeline's first build call (later calls return)
    seen: set[int] = set()
    build = Pipeline.build

    def recorded(self):
        if id(self) not in seen:
            seen.add(id(self))
            built.append(threading.current_thread().name)
        return build(self)

    monkeypatch.setattr(Pipeline, "build", recorded)
    source = ef.data.ImageFolder(root + "/train", image_size=(28, 28))
    placement = Placement.create()
    plan = ef.data.Plan(len(source), 8, seed=0, steps_per_execution=2, num_shards=placement.num_shards)
    loader = Loader(source, plan, placement, threaded=True, pipelines_per_device=2)
    try:
        assert built == []
        assert loader.chunk_spec() is not None  # declared: it waits for no build
        next(loader)
        assert built == ["easyfit-loader"] * 2
    finally:
        loader.close()


def test_inferred_sizes_a_transform_or_a_function_augment_leave_the_outputs_to_the_first_run(root):
    folder = root + "/train"
    assert ef.data.ImageFolder(folder).output_spec() is None  # sizes as stored: the run tells
    assert ef.data.ImageFolder(folder, image_size=(28, 28), transform=lambda x: x).output_spec() is None
    assert ef.data.ImageFolder(folder, image_size=(28, 28), augment=lambda x: x).output_spec() is None
    assert ef.data.ImageFolder(folder, image_size=(28, 28)).output_spec() is not None


def test_outputs_that_are_not_the_declared_ones_stop_the_fit_naming_both(root, monkeypatch):
    source = ef.data.ImageFolder(root + "/train", image_size=(28, 28))
    monkeypatch.setattr(source, "output_spec", lambda: [((28, 28, 3), np.uint8), ((), np.int32)])
    trainer = ef.Trainer(Recorder(Notes()), optimizer="sgd", seed=0)
    trainer._data.loader_options = replace(trainer._data.loader_options, threaded=True)
    with pytest.raises(RuntimeError, match=r"\(28, 28, 1\) uint8.* not the \(28, 28, 3\) uint8"):
        trainer.fit(source, epochs=1, batch_size=16, verbose=0, cache=False)


_IMPORT_WHILE = """
import sys, threading
import easyfit as ef
from flax import linen as nn

assert "nvidia.dali" not in sys.modules  # easyfit's import leaves DALI for its first use
ef.Trainer(nn.Dense(3), optimizer="sgd")  # its devices: JAX's runtime starts
running = [t.name for t in threading.enumerate() if t.name.startswith("easyfit")]
print(running, "nvidia.dali.fn" in sys.modules, "nvidia.dali.pipeline" in sys.modules)
"""


def test_the_trainer_imports_dali_while_the_runtime_starts_and_leaves_nothing_running():
    """DALI is imported by the Trainer, and done when it returns: the user's own DALI import
    right after it, or fit's, never meets a half-made DALI (its package imports itself
    circularly, which two threads importing it at once break)."""
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_WHILE], capture_output=True, text=True, timeout=300, check=True
    ).stdout.split()
    assert out == ["[]", "True", "True"]


def test_import_while_imports_here_and_works_in_a_thread(tmp_path, monkeypatch):
    from easyfit._lazy import import_while

    (tmp_path / "where_imported.py").write_text(
        "import threading\nTHREAD = threading.current_thread().name\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "where_imported", raising=False)
    worker = import_while(lambda: threading.current_thread().name, "where_imported", "no_such_module_here")
    assert worker != "MainThread"
    assert sys.modules["where_imported"].THREAD == "MainThread"
    assert "no_such_module_here" not in sys.modules  # left to its next import to raise

    def fails():
        raise RuntimeError("no devices")

    with pytest.raises(RuntimeError, match="no devices"):
        import_while(fails)


def test_a_lazy_module_touched_by_many_threads_at_once_is_imported_whole_for_each(tmp_path, monkeypatch):
    """Threads that reach a lazy module together (saves from several threads: Orbax's) each
    get the module whole, never one whose code is still running: LazyLoader let them in."""
    from easyfit._lazy import lazy_module

    runs = tmp_path / "runs"
    (tmp_path / "slow_to_import.py").write_text(
        f"import time\nwith open({str(runs)!r}, 'a') as f:\n    f.write('ran ')\ntime.sleep(0.2)\nLATE = 42\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_to_import", raising=False)
    with pytest.raises(ModuleNotFoundError, match="no_such_module_here"):
        lazy_module("no_such_module_here")
    module = lazy_module("slow_to_import")
    assert not runs.exists()  # nothing imported before its first use
    threads = 8
    barrier = threading.Barrier(threads)
    seen: list[Any] = []

    def touch() -> None:
        barrier.wait()
        try:
            seen.append(module.LATE)
        except Exception as e:  # noqa: BLE001 - the assertion names it
            seen.append(repr(e))

    workers = [threading.Thread(target=touch) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert seen == [42] * threads
    assert runs.read_text() == "ran "  # imported once
    assert lazy_module("slow_to_import") is sys.modules["slow_to_import"]
