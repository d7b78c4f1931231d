"""A process ends cleanly after catching an error that fit raised while it was still compiling
(a compilation left running when JAX's exit handler releases the backend aborted the process:
``terminate called after throwing an instance of ...``, status 134)."""

from __future__ import annotations

import pytest

import easyfit as ef
from tests.helpers import run_program
from tests.helpers.internals import built_pipelines


@pytest.mark.slow
def test_exit_after_a_caught_data_error_never_aborts(tmp_path):
    root = ef.datasets.sample_folder(tmp_path / "data", limit=(100, 20))
    for _ in range(3):  # without the fix, most runs here aborted (one in three in the report)
        proc = run_program("data_error_exit.py", root, "200", timeout=300)
        assert proc.returncode == 0 and "terminate called" not in proc.stderr, proc.stderr[-2000:]
        assert "DataError: " in proc.stdout and "outside the model's 5 outputs" in proc.stdout


def test_a_failed_fit_closes_its_training_loader(monkeypatch, tmp_path):
    import numpy as np

    from easyfit.data.loader import Loader
    from tests.helpers.models import SmallMLP

    closed = []
    close = Loader.close
    monkeypatch.setattr(Loader, "close", lambda self: (closed.append(self), close(self))[1])
    x, y = np.zeros((20, 4, 4, 1), np.float32), np.full(20, 12)  # labels beyond 10 outputs
    with pytest.raises(ef.errors.DataError, match="outside the model's 10 outputs"):
        ef.Trainer(SmallMLP()).fit(x, y, batch_size=10, verbose=0)
    assert closed and all(not built_pipelines(loader) for loader in closed)


def test_a_keyboard_interrupt_raised_in_a_callback_goes_through_after_the_cleanup(monkeypatch, trainer):
    """Raised in a training batch's hook and in a validation batch's: the KeyboardInterrupt
    itself reaches the caller, after on_interrupt and on_train_end, every loader closed."""
    import numpy as np

    from easyfit.callbacks import LambdaCallback
    from easyfit.data.loader import Loader

    closed = []
    close = Loader.close
    monkeypatch.setattr(Loader, "close", lambda self: (closed.append(self), close(self))[1])
    x, y = np.zeros((16, 4, 4, 1), np.float32), np.arange(16) % 10
    called: list[str] = []
    for hook in ("on_train_batch_end", "on_test_batch_end"):

        def interrupt(batch, logs):
            raise KeyboardInterrupt  # as a Ctrl-C landing in the callback

        callbacks = [
            LambdaCallback(**{hook: interrupt}),
            LambdaCallback(
                on_interrupt=lambda logs: called.append("on_interrupt"),
                on_train_end=lambda logs: called.append("on_train_end"),
            ),
        ]
        closed.clear()
        called.clear()
        with pytest.raises(KeyboardInterrupt):
            trainer.fit(x, y, batch_size=4, epochs=2, verbose=0, validation_data=(x, y), callbacks=callbacks)
        assert called == ["on_interrupt", "on_train_end"], hook
        assert closed and all(not built_pipelines(loader) for loader in closed), hook
