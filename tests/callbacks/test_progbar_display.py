"""The progress display as a user sees it: a real pseudo-terminal of 80 and 120 columns, read
back as a screen (pyte), and a notebook executed by a Jupyter kernel (nbclient)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from easyfit.callbacks.progbar import format_value
from tests.helpers import PROGRAMS, ROOT

ROWS = 200  # tall enough that nothing of the run scrolls off


def _run_in_terminal(columns: int, argv: list[str]) -> tuple[int, bytes]:
    """Runs ``argv`` with stdin, stdout and stderr on a pseudo-terminal ``columns`` wide; its
    exit status and every byte it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(TERM="xterm", PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(timeout=600), b"".join(chunks)


@pytest.mark.slow
@pytest.mark.parametrize("columns", [80, 120])
def test_a_terminal_shows_every_metric_of_the_last_epoch_beside_a_wide_bar(columns, tmp_path):
    import pyte

    out = tmp_path / "history.json"
    argv = [sys.executable, str(PROGRAMS / "progress_fit.py"), str(tmp_path / "data"), str(out)]
    rc, written = _run_in_terminal(columns, argv)
    screen = pyte.Screen(columns, ROWS)
    pyte.ByteStream(screen).feed(written)
    lines = [line.rstrip() for line in screen.display]
    assert rc == 0, "\n".join(lines)
    history = json.loads(out.read_text())
    assert {"val_loss", "val_accuracy", "input_wait"} <= set(history)
    last = max(i for i, line in enumerate(lines) if line.startswith("Epoch 2/2"))
    below = lines[last + 1 :]
    for name, values in history.items():  # each "name: value" whole on one line under the bar
        field = f"{name}: {format_value(values[-1])}"
        assert any(field in line for line in below), (field, lines)
    assert all(len(line) < columns for line in below)
    assert lines[last].count("█") >= columns // 3  # the epoch's finished bar
    # every state the bar was drawn in (each carriage return redraws it) kept a bar of at
    # least 12 cells, whatever metrics rode along
    renders = re.split(r"[\r\n]+", written.decode("utf-8", "replace"))
    bars = [re.search(r"\d+%\|(.*?)\|", r) for r in renders if r.startswith("Epoch ")]
    assert bars and all(b is not None and len(b.group(1)) >= 12 for b in bars), renders
