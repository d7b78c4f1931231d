"""SIGTERM, as a job scheduler sends it before preempting a job: fit stops after the step in
progress, writes its backup, runs on_train_end and exits with status 143; run again, it ends
with the parameters of a run never stopped, bit for bit on CPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from easyfit.callbacks import BackupAndRestore
from tests.helpers import PROGRAMS, ROOT, last_json

pytestmark = pytest.mark.slow  # every test here runs programs in fresh interpreters


def _npz(path) -> list[np.ndarray]:
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def test_sigterm_backs_up_exits_143_and_resumes_exactly(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "PYTHONUNBUFFERED": "1"}
    program = [sys.executable, str(PROGRAMS / "train_preempted.py")]
    cmd = program + [str(tmp_path / "backup"), str(tmp_path / "resumed.npz"), "--delay", "0.1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stdout:  # 15 batches an epoch, a backup every 3: stop in epoch 1
            lines.append(line.strip())
            if line.split()[:3] == ["batch", "1", "4"]:
                proc.send_signal(signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=120)
        lines += out.splitlines()
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "train end" in lines  # on_train_end ran before the exit
    assert not (tmp_path / "resumed.npz").exists()
    point = BackupAndRestore(tmp_path / "backup").restore_point()
    last = [tuple(map(int, ln.split()[1:])) for ln in lines if ln.startswith("batch")][-1]
    assert (point.epoch, point.batch) == (last[0], last[1] + 1)  # the last step, not step 3
    # run again; then, in the same interpreter, a new Trainer trains the fit never stopped (its
    # own backup folder): the reference
    again = subprocess.run(
        cmd + ["--reference", str(tmp_path / "ref"), str(tmp_path / "ref.npz")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    resumed = last_json(again)
    reference = resumed.pop("reference")
    assert reference["epochs"] == [0, 1]  # from the start, never stopped
    assert resumed["epochs"] == [1] and resumed["step"] == reference["step"]
    for a, b in zip(_npz(tmp_path / "ref.npz"), _npz(tmp_path / "resumed.npz"), strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("phase", ["compile", "chunk", "validation", "save"])
def test_a_second_ctrl_c_ends_in_one_keyboard_interrupt_and_a_clean_exit(tmp_path, phase):
    """Two Ctrl-C in a phase of fit (tests/programs/interrupt_phase.py): the first when the
    program says it entered the phase, the second once fit says it is stopping after the
    compilation in progress (compile, chunk; a second after the first should it never say so),
    or once the program sees that fit noted the first (validation, save). The program catches
    one KeyboardInterrupt, finds none of easyfit's threads running, and exits with status 0:
    never a signal (an abort, a segfault) nor a hang."""
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    program = [sys.executable, str(PROGRAMS / "interrupt_phase.py"), phase, str(tmp_path / "model")]
    proc = subprocess.Popen(program, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    second = "noted" if phase in ("validation", "save") else "easyfit: stopping after the compilation"
    sent: list[str] = []
    lock = threading.Lock()

    def interrupt(why: str, number: int) -> None:
        with lock:
            if len(sent) == number - 1 and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                sent.append(why)

    watchdog = threading.Timer(240, proc.kill)  # a hang fails the test rather than hang it
    watchdog.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.strip() == f"phase {phase}":
                interrupt("marker", 1)
                if phase in ("compile", "chunk"):
                    threading.Timer(1.0, interrupt, ("late", 2)).start()
            elif line.startswith(second):
                interrupt("marker", 2)
        proc.wait(timeout=60)
    finally:
        watchdog.cancel()
        proc.kill()
    out = "\n".join(lines)
    assert proc.returncode == 0, out[-3000:]
    assert lines[-2:] == ["caught KeyboardInterrupt", "left running: nothing"], out[-3000:]
    assert sent == ["marker", "marker"], out[-3000:]
