"""Two processes x two CPU devices on localhost, against one process x four devices."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import easyfit as ef
from tests.helpers import PROGRAMS, last_json, run_program

pytestmark = pytest.mark.slow  # every test here runs programs in fresh interpreters


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch(root, out, *extra, each=((), ())):
    """The two processes of train_multiprocess.py on ``root`` (or a root each), given ``extra``
    both and ``each[i]`` process i."""
    roots = (root, root) if isinstance(root, str) else root
    port = _free_port()
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "PYTHONUNBUFFERED": "1"}
    return [
        subprocess.Popen(
            [
                sys.executable,
                str(PROGRAMS / "train_multiprocess.py"),
                roots[i],
                str(i),
                "2",
                str(port),
                str(out),
                *extra,
                *each[i],
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]


@pytest.fixture(scope="module")
def two_processes(mnist_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("multiprocess")
    procs = _launch(mnist_dir, out)
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    return out, json.loads(logs[0].strip().splitlines()[-1]), logs


def test_same_parameters_as_one_process_with_four_devices(two_processes, mnist_dir, tmp_path):
    out, result, logs = two_processes
    assert result["processes"] == 2 and result["devices"] == 4
    single = tmp_path / "single.npz"
    last_json(run_program("train_devices.py", mnist_dir, "--save", str(single), devices=4))
    a, b = np.load(out / "params.npz"), np.load(single)
    assert len(a.files) == len(b.files) > 0
    for key in a.files:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-5)


def test_a_checkpoint_saved_by_two_processes_loads_in_one(two_processes):
    import jax
    import optax

    import easyfit as ef
    from tests.helpers.models import SmallMLP

    out, _, _ = two_processes
    restored = ef.Trainer.from_checkpoint(out / "ckpt", SmallMLP(), optimizer=optax.sgd(0.1, momentum=0.9))
    saved = np.load(out / "params.npz")
    leaves = jax.tree_util.tree_leaves(jax.device_get(restored.params))
    assert len(leaves) == len(saved.files)
    for leaf, key in zip(leaves, saved.files):
        assert np.array_equal(np.asarray(leaf), saved[key])


def test_every_sample_once_per_epoch_across_processes(two_processes):
    out, _, _ = two_processes
    per_process = [json.loads((out / f"seen-{i}.json").read_text()) for i in range(2)]
    for epoch in range(2):
        union = sorted(per_process[0][epoch] + per_process[1][epoch])
        assert union == list(range(1000))
        assert per_process[0][epoch] and per_process[1][epoch]


def test_evaluate_and_predict_see_each_sample_once(two_processes):
    _, result, logs = two_processes
    assert result["predict_rows"] == 500
    assert 0.85 < result["evaluate"]["accuracy"] <= 1.0
    assert "Epoch 1/2" in logs[0] and "Epoch 1/2" not in logs[1]  # only process 0 reports


def test_a_dead_process_stops_the_other_within_the_timeout(mnist_dir, tmp_path):
    procs = _launch(mnist_dir, tmp_path, "--epochs", "50", "--die-after-epoch", "0", "--fit-only")
    victim, survivor = procs[1], procs[0]
    victim.communicate(timeout=300)
    assert victim.returncode == 3
    try:  # the heartbeat timeout is 10 s: 240 s is generous for a loaded machine
        output = survivor.communicate(timeout=240)[0]
    except subprocess.TimeoutExpired:
        survivor.kill()
        pytest.fail("the surviving process still runs 240 s after its peer died")
    assert survivor.returncode not in (0, 3)  # an error, not the planned exit
    assert "another task died" in output


@pytest.fixture(scope="module")
def disagreements(mnist_dir, tmp_path_factory) -> dict[str, list[str]]:
    """``{call: [output of process 0, of process 1]}``: train_multiprocess.py's disagreements,
    in one pair of processes: process 1 given batch_size=100 at fit and at predict (process 0:
    200), then a copy of the data with one file renamed (as many samples, the same classes; only
    the data's fingerprint, its files' names and sizes, tells them apart)."""
    tmp = tmp_path_factory.mktemp("disagreements")
    other = tmp / "other"
    shutil.copytree(mnist_dir, other)
    first = min((other / "train").rglob("*.png"))
    first.rename(first.with_name("renamed-" + first.name))
    procs = _launch(
        mnist_dir,
        tmp,
        each=(("--disagreements", mnist_dir), ("--disagreements", str(other), "--batch-size", "100")),
    )
    try:  # the bound only keeps a hang from blocking the suite (both meet at once, error at once)
        outputs = [p.communicate(timeout=300)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("a process still runs 300 s after it was started: a disagreement hung")
    calls: dict[str, list[str]] = {}
    for p, output in zip(procs, outputs, strict=True):
        assert p.returncode == 0, output[-3000:]
        parts = output.split("--- ")[1:]
        assert [part.split("\n", 1)[0] for part in parts] == [
            "fit-batch-size",
            "predict-batch-size",
            "fit-data",
        ]
        for part in parts:
            name, said = part.split("\n", 1)
            calls.setdefault(name, []).append(said)
    return calls


def test_processes_given_different_batch_sizes_both_stop_naming_it(disagreements):
    for output in disagreements["fit-batch-size"]:
        assert "ValueError: the processes differ at fit" in output, output[-3000:]
        assert "process 1 has batch_size=100, process 0 has 200" in output, output[-3000:]
        assert "Epoch 1/" not in output  # stopped before training


def test_processes_predicting_with_different_batch_sizes_both_stop_naming_it(disagreements):
    """``predict`` (and ``evaluate``) called alone agree too: no hang in their collectives."""
    for output in disagreements["predict-batch-size"]:
        assert "ValueError: the processes differ at predict" in output, output[-3000:]
        assert "process 1 has batch_size=100, process 0 has 200" in output, output[-3000:]


def test_processes_given_different_data_both_stop_naming_it(disagreements):
    for output in disagreements["fit-data"]:
        assert "ValueError: the processes differ at fit" in output, output[-3000:]
        assert "process 1 has data.files=" in output and "process 0 has " in output, output[-3000:]
        assert "data.samples" not in output and "batch_size" not in output


@pytest.mark.slow
def test_both_processes_killed_while_saving_always_leave_a_loadable_checkpoint(tmp_path):
    """ModelCheckpoint("latest", save_freq=1) on 2 processes, both SIGKILLed at a random moment
    after the first save, in several trials: a complete ``latest`` (or the copy a kill between
    the swap's renames left beside it) always loads."""
    import optax

    import easyfit as ef
    from tests.helpers.models import SmallMLP

    rng = np.random.default_rng(17)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "PYTHONUNBUFFERED": "1"}
    steps = []
    for trial in range(4):
        out = tmp_path / f"trial-{trial}"
        out.mkdir()
        port = _free_port()
        procs = [
            subprocess.Popen(
                [sys.executable, str(PROGRAMS / "save_multiprocess.py"), str(i), "2", str(port), str(out)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i in range(2)
        ]
        try:
            # trial t kills after the (t + 1)th save, whatever the machine's speed, so that the
            # kills fall at different steps; then at a random moment, most likely mid-save (the
            # programs end by themselves after 200 saves: no wait here can last for ever)
            saves, last = 0, None
            while saves < trial + 1:
                assert all(p.poll() is None for p in procs), f"the processes ended before {trial + 1} saves"
                try:
                    inode = os.stat(out / "latest").st_ino  # each save swaps a new folder in
                except FileNotFoundError:
                    inode = None
                if inode is not None and inode != last:
                    saves, last = saves + 1, inode
                time.sleep(0.02)
            time.sleep(rng.uniform(0, 1.0))
        finally:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
        meta = ef.checkpoint.verify(out / "latest")
        restored = ef.Trainer.from_checkpoint(out / "latest", SmallMLP(), optimizer=optax.sgd(0.1))
        assert int(restored.state.step) == meta["step"] >= 1
        steps.append(meta["step"])
    assert len(set(steps)) > 1  # the kills fell at different moments


# A process that never joins a multi-process run: a Python TimeoutError within the user's

JOIN = """
import sys, easyfit as ef
try:
    ef.distributed.initialize(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                              initialization_timeout=float(sys.argv[4]))
except TimeoutError as e:
    print("TimeoutError:", e)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(address: str, n: int, pid: int, timeout: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", JOIN, address, str(n), str(pid), str(timeout)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_every_process_that_came_names_the_missing_one():
    address = f"localhost:{_port()}"
    procs = [_start(address, 3, pid, 4) for pid in (0, 1)]  # process 2 never comes
    # the message is easyfit's own, raised at its 4 s timeout, not JAX's after 5 minutes; the
    # bound only keeps a hang from blocking the suite: generous for a loaded machine
    outs = [p.communicate(timeout=240) for p in procs]
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err[-2000:]  # a Python error, no C++ abort
        assert f"TimeoutError: {address}: process(es) [2] of 3 never arrived within 4 s" in out, out


def test_the_coordinator_alone_names_every_missing_process():
    address = f"127.0.0.1:{_port()}"
    with pytest.raises(TimeoutError, match=r"127\.0\.0\.1:\d+: process\(es\) \[1, 2, 3\] of 4 never"):
        ef.distributed.initialize(address, 4, 0, initialization_timeout=1)


def test_a_process_without_its_coordinator_says_so():
    address = f"127.0.0.1:{_port()}"
    with pytest.raises(TimeoutError, match="the coordinator \\(process 0\\) did not answer within 1.5 s"):
        ef.distributed.initialize(address, 2, 1, initialization_timeout=1.5)


# A process that never reaches an agreement (it ended before fit, or runs other steps): the
# others raise a TimeoutError naming it; it waits in JAX's shutdown for them meanwhile.

AGREE = """
import sys, easyfit as ef
pid = int(sys.argv[2])
ef.distributed.initialize(sys.argv[1], 2, pid, agreement_timeout=3)
if pid == 0:
    try:
        ef.distributed.agree("fit", lambda: {"batch_size": 32})
    except TimeoutError as e:
        print("TimeoutError:", e)
"""


def test_a_process_that_never_reaches_fit_is_named_by_the_others():
    address = f"127.0.0.1:{_port()}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", AGREE, address, str(pid)], stdout=subprocess.PIPE, text=True, env=env
        )
        for pid in (0, 1)
    ]
    try:  # the bound only keeps a hang from blocking the suite
        outs = [p.communicate(timeout=240)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("a process still runs 240 s after it was started")
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "TimeoutError: process(es) [1] of 2 did not reach fit within 3 s (agreement_timeout)" in outs[0]


def test_one_process_agrees_with_itself_at_no_cost():
    """Without jax.distributed, nothing is computed: the values' function is never called."""
    ef.distributed.agree("fit", lambda: 1 / 0)
    ef.distributed.agree_on_fit(object(), None, batch_size=32)  # a fingerprint would raise here
