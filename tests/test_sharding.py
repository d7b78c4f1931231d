"""``Trainer(sharding=)``: the layout rules (pure, on shapes), and on 8 virtual devices in a fresh
interpreter: ``zero1`` and ``fsdp`` train to ``replicated``'s numbers, hold the bytes the rule
says per device, a checkpoint moves between layouts, a backup taken on 8 devices resumes on 4
and on 1, and a second mesh axis ("model") holds a rule's split; in real processes
(tests/programs/elastic.py): a fit SIGKILLed on 8 devices resumes on 4 and on 2, and one
SIGKILLed on 4 resumes on 8, with the uninterrupted run's samples, step by step, 2 processes
x 4 devices train as 1 x 8, and keep and read back their sharded initial state per process."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from easyfit.callbacks import BackupAndRestore
from easyfit.core.sharding import StateSharding, array_spec, state_specs
from easyfit.core.state import TrainState
from tests.helpers import PROGRAMS, run_program


def _state(params):
    tx = optax.adam(1e-3)
    return TrainState(
        step=jax.ShapeDtypeStruct((), jnp.int32),
        params=params,
        opt_state=jax.eval_shape(tx.init, params),
        model_state={"batch_stats": {"mean": jax.ShapeDtypeStruct((4096,), jnp.float32)}},
        rng=jax.ShapeDtypeStruct((2,), jnp.uint32),
        ema_params=params,
    )


PARAMS = {
    "embed": {"kernel": jax.ShapeDtypeStruct((1000, 2048), jnp.float32)},  # 7.8 MiB; 1000 % 8 == 0
    "odd": {"kernel": jax.ShapeDtypeStruct((1001, 2049), jnp.float32)},  # nothing divides
    "head": {"kernel": jax.ShapeDtypeStruct((2048, 10), jnp.float32)},  # 80 KiB
}


def test_big_vision_rule_by_kind():
    assert array_spec(jax.ShapeDtypeStruct((1000, 2048), jnp.float32), 8) == P(None, "data")  # the largest
    assert array_spec(jax.ShapeDtypeStruct((2048, 1001), jnp.float32), 8) == P("data")
    assert array_spec(jax.ShapeDtypeStruct((1001, 2048), jnp.float32), 8) == P(None, "data")  # next largest
    assert array_spec(jax.ShapeDtypeStruct((1024, 1024), jnp.float32), 8) == P()  # exactly 4 MiB: kept whole
    assert array_spec(jax.ShapeDtypeStruct((1024, 1025), jnp.float32), 1) == P()  # one device
    state = _state(PARAMS)
    axes = {"data": 8}
    rep = state_specs(state, StateSharding.of("replicated"), axes)
    assert set(jax.tree_util.tree_leaves(rep, is_leaf=lambda x: isinstance(x, P))) == {P()}
    zero1 = state_specs(state, StateSharding.of("zero1"), axes)
    assert zero1.params["embed"]["kernel"] == P()
    assert zero1.opt_state[0].mu["embed"]["kernel"] == P(None, "data")
    assert zero1.opt_state[0].nu["odd"]["kernel"] == P()
    assert zero1.ema_params["embed"]["kernel"] == P(None, "data")
    assert zero1.opt_state[0].mu["head"]["kernel"] == P()  # small
    fsdp = state_specs(state, StateSharding.of("fsdp", min_bytes=1 << 10), axes)
    assert fsdp.params["embed"]["kernel"] == P(None, "data")
    assert fsdp.params["head"]["kernel"] == P("data")
    assert fsdp.model_state["batch_stats"]["mean"] == P("data")
    assert fsdp.step == P() and fsdp.rng == P() and fsdp.opt_state[0].count == P()


def test_rules_and_their_errors():
    rules = StateSharding.of([(r"^head/", ("data", None)), ("embed/kernel", P(None, "data"))])
    specs = state_specs(_state(PARAMS), rules, {"data": 8})
    assert specs.params["head"]["kernel"] == P("data")  # trailing Nones dropped, as XLA does
    assert specs.params["embed"]["kernel"] == P(None, "data")
    assert specs.params["odd"]["kernel"] == P()  # no rule: replicated
    assert specs.opt_state[0].mu["head"]["kernel"] == P("data")  # mirrors its parameter
    assert specs.ema_params["embed"]["kernel"] == P(None, "data")
    with pytest.raises(ValueError, match=r"odd/kernel of shape \(1001, 2049\).*does not divide"):
        state_specs(_state(PARAMS), StateSharding.of([("odd", ("data",))]), {"data": 8})
    with pytest.raises(ValueError, match=r"head/kernel.*mesh axis 'model'"):
        state_specs(_state(PARAMS), StateSharding.of([("head", (None, "model"))]), {"data": 8})
    with pytest.raises(ValueError, match="sharding='ddp'"):
        StateSharding.of("ddp")
    with pytest.raises(ValueError, match=r"rule 0's regex '\('"):
        StateSharding.of([("(", P())])


@pytest.mark.slow  # a fresh interpreter with 8 devices
def test_zero1_and_fsdp_train_as_replicated_on_eight_devices(tmp_path):
    out = str(tmp_path / "run")
    proc = run_program("sharding_devices.py", out, devices=8)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "8"
    assert "easyfit: the training state is sharded: fsdp over 8 devices ('data' axis)" in proc.stdout
    summary = (tmp_path / "run.summary").read_text()
    assert "Sharding: fsdp over 8 devices" in summary, summary
    assert re.search(r"params/Dense_0/kernel +\(1568, 10\) +P\('data',?\) +7\.7 KiB per device", summary), (
        summary
    )
    assert re.search(r"optimizer: .* per device, of .*", summary), summary
    layouts = json.loads((tmp_path / "run.json").read_text())
    with np.load(out + ".npz") as f:
        got: dict[str, dict[str, np.ndarray]] = {}
        for key in f.files:
            run, path = key.split("|")
            got.setdefault(run, {})[path] = f[key]
    # the same numbers: float32 gradients summed over 8 devices in another order (all-reduce
    # against reduce-scatter), 4 updates and 8 BatchNorm moves: a few ulps of the values
    for reference, others in (
        ("sgd-replicated", ["sgd-fsdp"]),
        ("adam-replicated", ["adam-zero1", "adam-fsdp"]),
    ):
        assert any("stats" in p for p in got[reference]) and any("ema" in p for p in got[reference])
        assert any("acc_grads" in p for p in got[reference])  # gradient accumulation's state
        for other in others:
            assert got[other].keys() == got[reference].keys()
            for path, want in got[reference].items():
                np.testing.assert_allclose(
                    got[other][path], want, rtol=1e-5, atol=1e-7, err_msg=f"{other} {path}"
                )
    for run in ("sgd-replicated", "sgd-fsdp", "adam-replicated", "adam-zero1", "adam-fsdp"):
        assert got[f"{run}-compiled"]["train"].tolist() == [1], run  # one compilation, 2 epochs
    # the layouts and the bytes per device, read from the arrays' shards
    sharded = {
        "replicated": set(),
        "zero1": {"['opt']", "['ema']"},
        "fsdp": {"['opt']", "['ema']", "['params']", "['stats']"},
    }
    for run, arrays in layouts.items():
        kind = run.split("-")[-1].split(">")[-1]
        for path, a in arrays.items():
            split = bool(a["spec"])
            assert a["device_bytes"] == (a["bytes"] // 8 if split else a["bytes"]), (run, path, a)
            part = path.split("]")[0] + "]"
            if part in sharded[kind] and "Dense_0']['kernel" in path:
                assert a["spec"] == ["data"], (run, path, a)  # (1568, 10): along 1568
            if part not in sharded[kind] or "count" in path or "_step" in path:
                assert not split, (run, path, a)
        total = sum(a["device_bytes"] for a in arrays.values())
        whole = sum(a["bytes"] for a in arrays.values())
        if kind == "fsdp":
            assert total < whole / 7, (run, total, whole)  # all but the 40-byte bias and counters
    # a checkpoint saved under one layout restores into the other, to the same numbers
    for saved, into in (("replicated", "fsdp"), ("fsdp", "replicated")):
        for path, want in got[f"adam-{saved}"].items():
            np.testing.assert_array_equal(got[f"{saved}->{into}"][path], want, err_msg=path)
    # a backup taken under fsdp on 8 devices, the run stopped mid-epoch (between two updates of
    # the accumulated gradients), resumed on 4 devices (zero1) and on 1 (replicated): the
    # uninterrupted run's numbers (the same samples in the same steps), up to summation order
    # an NNX model: the same numbers, and the user's module left holding the sharded weights
    assert str(got["nnx-fsdp-module"]["spec"]) == "P('data',)"  # (784, 128)
    assert str(got["nnx-replicated-module"]["spec"]) == "P()"
    assert got["nnx-fsdp"].keys() == got["nnx-replicated"].keys() and got["nnx-fsdp"]
    for path, want in got["nnx-replicated"].items():
        np.testing.assert_allclose(got["nnx-fsdp"][path], want, rtol=1e-5, atol=1e-7, err_msg=f"nnx {path}")
    # a second mesh axis: Dense_0's (1568, 10) kernel and its Adam moment split over "model"
    # (halves of 10 outputs on each device pair), the batch over "data": replicated's numbers
    for part in ("params", "mu"):
        spec, whole, shard, described = got[f"adam-model-{part}"]["layout"].tolist()
        assert (spec, int(shard) * 2, described) == (
            "P(None, 'model')",
            int(whole),
            "1 rule over 8 devices ('data' x 'model' axes: 4 x 2)",
        )
    for path, want in got["adam-replicated"].items():
        np.testing.assert_allclose(
            got["adam-model"][path], want, rtol=1e-5, atol=1e-7, err_msg=f"model axis {path}"
        )
    # a batch of 4 shards of 2 rows, shard i made on device 2i and copied to device 2i + 1
    np.testing.assert_array_equal(
        got["model-axis-rows"]["whole"], np.repeat(np.arange(4.0), 2)[:, None].repeat(3, 1)
    )
    assert got["model-axis-rows"]["shards"].tolist() == [[d // 2, d] for d in range(8)]
    for resumed in ("resumed-zero1-4", "resumed-replicated-1"):
        assert got[resumed].keys() == got["adam-replicated"].keys()
        for path, want in got["adam-replicated"].items():
            np.testing.assert_allclose(
                got[resumed][path], want, rtol=1e-5, atol=1e-7, err_msg=f"{resumed} {path}"
            )


def _env(devices: int) -> dict[str, str]:
    return {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "PYTHONUNBUFFERED": "1",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _killed_when_blocked(program: list[str], mode: str, out, devices: int) -> None:
    """Runs elastic.py's ``mode`` on ``devices`` devices and SIGKILLs it once it prints
    ``blocked`` (its backup of epoch 1's second batch written)."""
    killed = subprocess.Popen(
        [*program, mode, str(out)],
        env=_env(devices),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(300, killed.kill)  # a hang fails the test rather than hang it
    watchdog.start()
    try:
        lines = []
        for line in killed.stdout:
            lines.append(line)
            if line.strip() == "blocked":
                killed.send_signal(signal.SIGKILL)
                break
    finally:
        watchdog.cancel()
        killed.kill()
        err = killed.communicate()[1]
    assert killed.returncode == -signal.SIGKILL and "blocked\n" in lines, "".join(lines) + err[-3000:]


@pytest.fixture(scope="module")
def elastic(tmp_path_factory):
    """tests/programs/elastic.py's runs, in order: 2 processes x 4 devices train under fsdp and
    save; 1 process x 4 devices trains the fit under zero1 with a backup after every batch and is
    SIGKILLed in epoch 1; 1 process x 8 devices trains the same fit uninterrupted, loads that
    checkpoint, resumes the 4-device backup under fsdp, then trains the fit again with a backup
    after every batch and is SIGKILLed in epoch 1; a process of 4 devices resumes that backup on 4
    (zero1) and on 2 (replicated)."""
    out = tmp_path_factory.mktemp("elastic")
    program = [sys.executable, str(PROGRAMS / "elastic.py")]
    port = _free_port()
    pair = [
        subprocess.Popen(
            [*program, "multiprocess", str(i), "2", str(port), str(out)],
            # the caches on, in a folder of the test's: the initial states kept per process
            env={**_env(4), "EASYFIT_COMPILATION_CACHE": "1", "XDG_CACHE_HOME": str(out / "cache")},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    try:  # the bound only keeps a hang from blocking the suite
        logs = [p.communicate(timeout=300)[0] for p in pair]
    finally:
        for p in pair:
            p.kill()
    assert [p.returncode for p in pair] == [0, 0], "\n".join(log[-3000:] for log in logs)
    _killed_when_blocked(program, "small", out, devices=4)  # zero1 on 4 devices: OUT/backup-small
    _killed_when_blocked(program, "killed", out, devices=8)  # resumes it on 8, then OUT/backup
    resumed = run_program("elastic.py", "resumed", str(out), devices=4, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    return out


def _arrays(path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _fit(path) -> dict[str, int]:
    """What a run of elastic.py wrote of its fit: its devices and the batches it trained."""
    with open(path) as f:
        return json.load(f)


def _same_training(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    """The same samples in the same steps (the ids each step received, exactly) and the same
    parameters and Adam moments up to float32 summation order: 8 updates of a 4-class MLP whose
    gradients are summed over another number of devices (or over processes through gloo) differ
    by a few ulps."""
    assert got.keys() == want.keys(), what
    seen = "['seen']['ids']"
    np.testing.assert_array_equal(got[seen], want[seen], err_msg=f"{what}: the samples of each step")
    for path, a in want.items():
        np.testing.assert_allclose(got[path], a, rtol=1e-5, atol=1e-7, err_msg=f"{what} {path}")


@pytest.mark.slow  # fresh interpreters: a SIGKILL, 4 devices after 8
def test_fsdp_killed_on_eight_devices_resumes_on_four_and_two_as_never_stopped(elastic):
    reference = _arrays(elastic / "ref.npz")
    ids = reference["['seen']['ids']"]  # (steps, batch): what each step of the fit received
    epochs = ids.reshape(2, -1)  # 4 steps an epoch
    assert all(sorted(e.tolist()) == list(range(64)) for e in epochs)  # each sample once an epoch
    assert epochs[0].tolist() != epochs[1].tolist()  # reshuffled
    point = BackupAndRestore(elastic / "backup").restore_point()  # what the killed run left
    assert (point.epoch, point.batch, point.meta["step"]) == (1, 2, 6)  # mid-epoch
    for devices in (4, 2):  # zero1 on 4 devices, replicated on 2
        _same_training(_arrays(elastic / f"resumed-{devices}.npz"), reference, f"resumed on {devices}")
        # trained from the backup on: epoch 1's last 2 batches, on that many devices
        assert _fit(elastic / f"resumed-{devices}.json") == {"devices": devices, "batches": 2}


@pytest.mark.slow  # fresh interpreters: a SIGKILL on 4 devices, 8 after
def test_zero1_killed_on_four_devices_resumes_on_eight_as_never_stopped(elastic):
    point = BackupAndRestore(elastic / "backup-small").restore_point()  # what the killed run left
    assert (point.epoch, point.batch, point.meta["step"]) == (1, 2, 6)  # mid-epoch
    _same_training(
        _arrays(elastic / "resumed-8.npz"), _arrays(elastic / "ref.npz"), "4 devices, resumed on 8"
    )
    assert _fit(elastic / "resumed-8.json") == {"devices": 8, "batches": 2}  # epoch 1's last 2


@pytest.mark.slow  # 2 processes
def test_fsdp_on_two_processes_trains_as_on_one_and_its_checkpoint_loads_there(elastic):
    two = _arrays(elastic / "mp.npz")
    _same_training(two, _arrays(elastic / "ref.npz"), "2 processes x 4 devices against 1 x 8")
    loaded = _arrays(elastic / "mp-loaded.npz")  # the 2-process checkpoint in 1 process x 8 devices
    assert loaded.keys() == two.keys()
    for path, a in two.items():
        np.testing.assert_array_equal(loaded[path], a, err_msg=path)


@pytest.mark.slow  # 2 processes
def test_an_initial_state_sharded_across_processes_is_kept_and_read_per_process(elastic):
    """Each process keeps the shards of the initial state its devices hold, and a new
    initialisation of the same state reads them back, bit for bit."""
    computed, read = _arrays(elastic / "mp-initial.npz"), _arrays(elastic / "mp-initial-read.npz")
    assert _fit(elastic / "mp-initial.json") == {"devices": 8, "reads": 0}
    assert _fit(elastic / "mp-initial-read.json") == {"devices": 8, "reads": 1}  # process 0's shards
    assert computed.keys() == read.keys()
    for path, a in computed.items():
        np.testing.assert_array_equal(read[path], a, err_msg=path)
    entries = list((elastic / "cache" / "easyfit" / "states").iterdir())
    assert len(entries) == 2, entries  # one a process: each holds other shards of the state


def test_annotations_in_the_model_are_honoured():
    from flax import linen as nn

    class Annotated(nn.Module):
        @nn.compact
        def __call__(self, x):
            kernel = nn.with_partitioning(nn.initializers.lecun_normal(), (None, "data"))
            hidden = nn.Dense(64, kernel_init=kernel)(x)  # Dense_0
            return nn.Dense(10)(hidden)

    params = jax.eval_shape(Annotated().init, jax.random.key(0), jnp.zeros((1, 16)))["params"]
    state = _state(params)
    for kind, want in (("replicated", P()), ("zero1", P(None, "data")), ("fsdp", P(None, "data"))):
        specs = state_specs(state, StateSharding.of(kind), {"data": 8})
        # a box keeps its metadata; its array's spec is the annotation's (16 x 64: under 4 MiB)
        assert specs.params["Dense_0"]["kernel"].value == want
        assert specs.opt_state[0].mu["Dense_0"]["kernel"].value == want
        assert specs.params["Dense_1"]["kernel"] == P()
    rules = StateSharding.of([("Dense_0/kernel", P())])  # the path without the box's key; a rule wins
    assert state_specs(state, rules, {"data": 8}).params["Dense_0"]["kernel"].value == P()
    with pytest.raises(ValueError, match=r"Dense_0/kernel of shape \(16, 64\): its annotation"):
        state_specs(state, StateSharding.of("fsdp"), {"data": 3})


def test_a_mesh_of_axes_checked_and_batches_split_over_data_only():
    from easyfit.parallel import Placement

    one = jax.devices()[:1]
    placement = Placement.create(one, {"data": -1, "model": 1})
    assert placement.mesh.axis_names == ("data", "model") and placement.num_shards == 1
    assert placement.local_shards == [(0, one[0])]
    with pytest.raises(ValueError, match=r"mesh=\{'model': 2\}: .* 'data' axis"):
        Placement.create(one, {"model": 2})
    with pytest.raises(ValueError, match=r"mesh=\{'data': -1, 'model': 2\}: .* the 1 devices"):
        Placement.create(one, {"data": -1, "model": 2})
    specs = state_specs(
        _state(PARAMS), StateSharding.of([("head", (None, "model"))]), {"data": 4, "model": 2}
    )
    assert specs.params["head"]["kernel"] == P(None, "model")
    assert specs.opt_state[0].nu["head"]["kernel"] == P(None, "model")  # mirrors its parameter
