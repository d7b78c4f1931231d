"""Does a change to easyfit's insides leave its results and its files as they were?

    python benchmarks/refactor_check.py write DIR    # with the code before the change
    python benchmarks/refactor_check.py check DIR    # with the code after it

``write`` runs a fixed fit on the CPU (the packaged MNIST sample as a folder and as arrays, a
small CNN with BatchNorm and dropout, SGD then Adam, a validation split, ``seed=0``) and keeps in
DIR: the final parameters and model state (``*.npz``), a ModelCheckpoint, a BackupAndRestore
backup left mid-fit (the fit stops itself after a few batches of epoch 2), a ``Trainer.save``
file and the kept initial states (``XDG_CACHE_HOME`` points into DIR). ``check`` runs the same
fits with the code now installed and says, for each: whether the parameters are bit-equal to
those written before; whether the old checkpoint, saved file and backup restore (the backup
resumes and finishes the fit, bit-equal to an uninterrupted run); and whether the kept initial
states written before were used again. It exits 1 when any check fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _flat(tree) -> dict[str, np.ndarray]:
    import jax

    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves}


def _model():
    from flax import linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            x = nn.Conv(8, (3, 3), strides=(2, 2))(x)
            x = nn.BatchNorm(use_running_average=not train)(x)
            x = nn.relu(x)
            x = x.reshape((x.shape[0], -1))
            x = nn.Dropout(0.1, deterministic=not train)(x)
            return nn.Dense(10)(x)

    return Net()


class _Stop(Exception):
    pass


def _fit(kind: str, out: str, backup: str | None, stop_at: int | None) -> None:
    """One fit in this process; writes ``out`` (npz of params and model state)."""
    import optax

    import easyfit as ef

    work = os.environ["REFACTOR_CHECK_DATA"]
    if kind == "folder":
        data: object = os.path.join(work, "folder", "train")
        opt = optax.sgd(0.05, momentum=0.9)
    else:
        x, y = ef.datasets.sample()["train"]
        data = (x[:512], y[:512])
        opt = optax.adam(1e-3)
    callbacks: list = []
    if backup is not None:
        callbacks.append(ef.callbacks.BackupAndRestore(backup, save_freq=3, delete_checkpoint=False))
    if stop_at is not None:

        class StopAt(ef.Callback):
            seen = 0

            def on_train_batch_end(self, batch, logs=None):
                StopAt.seen += 1
                if StopAt.seen == stop_at:
                    raise _Stop

        callbacks.append(StopAt())
    if stop_at is None and backup is None:
        callbacks.append(ef.callbacks.ModelCheckpoint(os.path.join(os.path.dirname(out), f"ckpt-{kind}")))
    trainer = ef.Trainer(_model(), optimizer=opt, seed=0)
    try:
        trainer.fit(data, epochs=3, batch_size=32, validation_split=0.2, callbacks=callbacks, verbose=0)
    except _Stop:
        return
    trainer.save(os.path.join(os.path.dirname(out), f"saved-{kind}"))
    np.savez(out, **_flat({"params": trainer.params, "state": trainer.state.model_state}))


def _run(*args: str, env: dict) -> str:
    proc = subprocess.run(
        [sys.executable, __file__, "_child", *args], env=env, capture_output=True, text=True
    )
    if proc.returncode:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"child {args} failed ({proc.returncode})")
    return proc.stdout


def _same(a: str, b: str) -> tuple[bool, float]:
    x, y = np.load(a), np.load(b)
    if sorted(x.files) != sorted(y.files):
        return False, float("inf")
    worst = max(float(np.max(np.abs(x[k].astype(np.float64) - y[k].astype(np.float64)))) for k in x.files)
    return all(np.array_equal(x[k], y[k]) for k in x.files), worst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["write", "check", "_child"])
    p.add_argument("dir")
    p.add_argument("rest", nargs="*")
    a = p.parse_args()
    if a.mode == "_child":
        kind, (out, backup, stop) = a.dir, a.rest
        _fit(kind, out, None if backup == "-" else backup, None if stop == "-" else int(stop))
        return
    root = os.path.abspath(a.dir)
    os.makedirs(root, exist_ok=True)
    data = os.path.join(root, "data")
    if not os.path.isdir(data):
        import easyfit as ef

        ef.datasets.sample_folder(os.path.join(data, "folder"), limit=(384, 64))
    env = dict(
        os.environ, REFACTOR_CHECK_DATA=data, JAX_PLATFORMS="cpu", XDG_CACHE_HOME=os.path.join(root, "cache")
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
    failed = []
    states = os.path.join(root, "cache", "easyfit", "states")
    kept = set(os.listdir(states)) if os.path.isdir(states) else set()
    for kind in ("folder", "arrays"):
        before = os.path.join(root, "before", kind)
        if a.mode == "write":
            os.makedirs(before, exist_ok=True)
            _run(kind, os.path.join(before, "final.npz"), "-", "-", env=env)
            _run(kind, os.path.join(before, "stopped.npz"), os.path.join(before, "backup"), "14", env=env)
            print(f"{kind}: written to {before}")
            continue
        after = tempfile.mkdtemp(prefix=f"after-{kind}-", dir=root)
        _run(kind, os.path.join(after, "final.npz"), "-", "-", env=env)
        same, worst = _same(os.path.join(before, "final.npz"), os.path.join(after, "final.npz"))
        print(f"{kind}: parameters bit-equal to before: {same} (max |diff| {worst:.3g})")
        failed += [] if same else [f"{kind} parameters"]
        backup = os.path.join(after, "backup")
        shutil.copytree(os.path.join(before, "backup"), backup)
        _run(kind, os.path.join(after, "resumed.npz"), backup, "-", env=env)
        same, worst = _same(os.path.join(before, "final.npz"), os.path.join(after, "resumed.npz"))
        print(f"{kind}: old backup resumes and finishes bit-equal: {same} (max |diff| {worst:.3g})")
        failed += [] if same else [f"{kind} backup"]
        code = (
            "import sys, numpy as np, easyfit as ef; sys.path.insert(0, sys.argv[3]);"
            "from refactor_check import _model, _flat;"
            "t = ef.Trainer.from_checkpoint(sys.argv[1], _model());"
            "u = ef.Trainer(_model()); u.load(sys.argv[2]);"
            "f = np.load(sys.argv[4]); a = _flat({'params': t.params}); b = _flat({'params': u.params});"
            "print(all(np.array_equal(a[k], f[k]) for k in a), all(np.array_equal(b[k], f[k]) for k in b))"
        )
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                code,
                os.path.join(before, f"ckpt-{kind}"),
                os.path.join(before, f"saved-{kind}"),
                HERE,
                os.path.join(before, "final.npz"),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        ok = proc.returncode == 0 and proc.stdout.split()[-2:] == ["True", "True"]
        print(f"{kind}: old ModelCheckpoint and saved file restore to the old parameters: {ok}")
        if not ok:
            sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
            failed.append(f"{kind} checkpoint/save")
    if a.mode == "check":
        new = set(os.listdir(states)) - kept if os.path.isdir(states) else set()
        print(f"kept initial states written before used again (none computed anew): {not new}")
        failed += [f"{len(new)} initial states computed anew"] if new else []
        print("FAILED: " + ", ".join(failed) if failed else "all checks passed")
        raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
