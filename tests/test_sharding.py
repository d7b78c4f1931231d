"""``Trainer(sharding=)``: the layout rules (pure, on shapes), and on 8 virtual devices in a fresh
interpreter: ``zero1`` and ``fsdp`` train to ``replicated``'s numbers, hold the bytes the rule
says per device, a checkpoint moves between layouts, and a backup taken on 8 devices resumes on
4 and on 1."""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from easyfit.core.sharding import StateSharding, array_spec, state_specs
from easyfit.core.state import TrainState
from tests.helpers import run_program


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
    for resumed in ("resumed-zero1-4", "resumed-replicated-1"):
        assert got[resumed].keys() == got["adam-replicated"].keys()
        for path, want in got["adam-replicated"].items():
            np.testing.assert_allclose(
                got[resumed][path], want, rtol=1e-5, atol=1e-7, err_msg=f"{resumed} {path}"
            )


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
