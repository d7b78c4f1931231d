"""Keras' callback hooks in fit, evaluate and predict: which run, in what order, with which logs
(keras/src/trainers/trainer_test.py, keras/src/callbacks/callback_test.py, and the order
keras/src/callbacks/callback_list.py and keras/src/backend/jax/trainer.py call them in).

Not ported: the eager / non-jit / jit and torch variants (easyfit always jits), the async
dispatch of batch hooks (easyfit calls them in the training thread, and builds batch logs only
when read), unrolled ``steps_per_execution`` and datasets of unknown size (easyfit always knows
an epoch's length).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from easyfit.callbacks import Callback, CallbackList, CSVLogger, EarlyStopping, History, ModelCheckpoint
from easyfit.data import Subset
from tests.helpers import kerasfit
from tests.helpers.kerasfit import Recorder, mnist_slices, small_trainer

data, trainer = kerasfit.data, kerasfit.trainer  # the module's fixtures


def _first(source, n):
    """The first ``n`` samples of ``source``."""
    return Subset(source, np.arange(n))


def _fit(trainer, data, callbacks, epochs=2, batch_size=100, **kw):
    train, val = data
    return trainer.fit(
        train, epochs=epochs, batch_size=batch_size, verbose=0, validation_data=val, callbacks=callbacks, **kw
    )


def test_hook_order_in_fit_evaluate_and_predict(trainer, data):
    # keras: callback_list.py and backend/jax/trainer.py (fit, evaluate, predict): the order of the hooks
    rec = Recorder()
    _fit(trainer, data, [rec])
    trainer.evaluate(data[1], batch_size=100, callbacks=[rec])
    trainer.predict(data[1], batch_size=100, callbacks=[rec])
    hooks = [(hook, index) for hook, index, _ in rec.calls]
    epoch = [("on_train_batch_begin", 0), ("on_train_batch_end", 0)]
    epoch += [("on_train_batch_begin", 1), ("on_train_batch_end", 1)]
    validation = [("on_test_begin", None), ("on_test_batch_begin", 0), ("on_test_batch_end", 0)]
    validation += [("on_test_end", None)]
    expected = [("on_train_begin", None)]
    for e in (0, 1):
        expected += [("on_epoch_begin", e), *epoch, *validation, ("on_epoch_end", e)]
    expected += [("on_train_end", None), *validation]
    expected += [("on_predict_begin", None), ("on_predict_batch_begin", 0), ("on_predict_batch_end", 0)]
    expected += [("on_predict_end", None)]
    assert hooks == expected


def test_callback_methods_keys(trainer, data):
    # keras: trainer_test.py::test_callback_methods_keys
    rec = Recorder()
    _fit(trainer, data, [rec], epochs=1)
    trainer.evaluate(data[1], batch_size=100, callbacks=[rec])
    trainer.predict(data[1], batch_size=100, callbacks=[rec])
    keys = {hook: k for hook, _, k in rec.calls}
    for hook in keys:
        if hook.endswith("_begin") or hook == "on_predict_end":
            assert keys[hook] == [], hook  # Keras passes {} where it has nothing to say
    metrics = ["accuracy", "loss"]
    assert keys["on_train_batch_end"] == metrics
    assert keys["on_test_batch_end"] == metrics
    assert keys["on_test_end"] == metrics
    epoch = sorted([*metrics, "input_wait", "learning_rate", "val_accuracy", "val_loss"])
    assert keys["on_epoch_end"] == epoch  # input_wait and learning_rate: see docs/keras.md
    assert keys["on_train_end"] == epoch
    assert keys["on_predict_batch_end"] == ["outputs"]


def test_begin_hooks_get_an_empty_dict_not_none(trainer, data):
    # keras: callback_list.py (pythonify_logs(None) is {}): begin hooks get logs={}
    seen = []

    class Begin(Callback):
        def on_train_begin(self, logs=None):
            seen.append(logs)

        def on_epoch_begin(self, epoch, logs=None):
            seen.append(logs)

        def on_train_batch_begin(self, batch, logs=None):
            seen.append(logs)

        def on_test_begin(self, logs=None):
            seen.append(logs)

    _fit(trainer, data, [Begin()], epochs=1)
    assert seen and all(isinstance(logs, dict) and not logs for logs in seen)


def test_predict_batch_end_outputs_are_the_predictions(trainer, data):
    # keras: trainer_test.py::test_callback_methods_keys (on_predict_batch_end gets {"outputs": ...})
    outputs = []

    class Outputs(Callback):
        def on_predict_batch_end(self, batch, logs=None):
            outputs.append(np.asarray(logs["outputs"]))

    predicted = trainer.predict(data[1], batch_size=30, callbacks=[Outputs()])  # 100 rows: 30+30+30+10
    assert [len(o) for o in outputs] == [30, 30, 30, 10]
    np.testing.assert_array_equal(np.concatenate(outputs), predicted)


def test_test_batch_end_logs_are_the_running_metrics(trainer, data):
    # keras: trainer_test.py::test_callback_methods_keys (on_test_batch_end gets the metrics so far)
    running = []

    class Running(Callback):
        def on_test_batch_end(self, batch, logs=None):
            running.append(dict(logs))

    result = trainer.evaluate(data[1], batch_size=50, callbacks=[Running()])
    assert len(running) == 2
    first = trainer.evaluate(_first(data[1], 50), batch_size=50)
    np.testing.assert_allclose(running[0]["loss"], first["loss"], rtol=1e-6)
    np.testing.assert_allclose(running[-1]["loss"], result["loss"], rtol=1e-6)


def test_batch_logs_only_for_callbacks_that_override_the_hook(tmp_path):
    # keras: callback_list.py::_configure_async_dispatch (only overridden batch hooks cost anything)
    per_epoch = [History(), CSVLogger(tmp_path / "a.csv"), EarlyStopping(), ModelCheckpoint(tmp_path / "m")]
    cbs = CallbackList(per_epoch, None, {})
    for hook in ("on_train_batch_end", "on_test_batch_end", "on_predict_batch_end"):
        assert not cbs.wants(hook)

    class OnBatchEnd(Callback):
        def on_batch_end(self, batch, logs=None):
            pass

    cbs = CallbackList([*per_epoch, OnBatchEnd()], None, {})
    assert cbs.wants("on_train_batch_end") and not cbs.wants("on_test_batch_end")


def test_on_batch_hooks_run_for_training_batches(trainer, data):
    # keras: trainer_test.py (StepObserver: on_batch_begin / on_batch_end, called by on_train_batch_*)
    calls = []

    class Steps(Callback):
        def on_batch_begin(self, batch, logs=None):
            calls.append(("begin", batch))

        def on_batch_end(self, batch, logs=None):
            calls.append(("end", batch, sorted(logs)))

    _fit(trainer, data, [Steps()], epochs=1)
    trainer.evaluate(data[1], batch_size=100, callbacks=[Steps()])  # not for test batches
    assert calls == [
        ("begin", 0),
        ("end", 0, ["accuracy", "loss"]),
        ("begin", 1),
        ("end", 1, ["accuracy", "loss"]),
    ]


def test_model_state_is_current_on_batch_end(trainer, data):
    # keras: callback_test.py::test_model_state_is_current_on_epoch_end
    steps = []
    start = int(trainer.state.step)

    class Current(Callback):
        def on_batch_end(self, batch, logs=None):
            steps.append(int(self.model.state.step) - start)

    _fit(trainer, data, [Current()], epochs=1, batch_size=50)
    assert steps == [1, 2, 3, 4]


def test_callbacks_can_update_state_at_batch_boundary(trainer, data):
    # keras: trainer_test.py::test_callbacks_can_update_state_at_batch_boundary
    class Counter(Callback):
        def __init__(self):
            super().__init__()
            self.train = self.test = self.predict = 0

        def on_train_batch_end(self, batch, logs=None):
            self.train += 1
            state = self.model.state
            self.model.state = state.replace(params=jax.tree_util.tree_map(lambda p: p * 0, state.params))

        def on_test_batch_end(self, batch, logs=None):
            self.test += 1

        def on_predict_batch_end(self, batch, logs=None):
            self.predict += 1

    counter = Counter()
    _fit(trainer, data, [counter], epochs=3, batch_size=50)
    assert (counter.train, counter.test) == (12, 6)
    assert all(not np.asarray(p).any() for p in jax.tree_util.tree_leaves(trainer.state.params))
    trainer.predict(data[0], batch_size=50, callbacks=[counter])
    assert counter.predict == 4
    np.testing.assert_array_equal(trainer.predict(data[1]), 0.0)  # the zeroed parameters predict


@pytest.mark.parametrize("method", ["fit", "evaluate", "predict"])
def test_stop_loop(trainer, data, method):
    # keras: trainer_test.py::test_stop_loop
    gerund, hook = {
        "fit": ("training", "train"),
        "evaluate": ("evaluating", "test"),
        "predict": ("predicting", "predict"),
    }[method]

    class Stopper(Callback):
        def __init__(self):
            super().__init__()
            self.counter = 0
            setattr(self, f"on_{hook}_batch_end", self.batch_end)

        def batch_end(self, batch, logs=None):
            self.counter += 1
            if self.counter == 3:
                setattr(self.model, f"stop_{gerund}", True)

    stopper = Stopper()
    train, val = data
    if method == "fit":
        history = trainer.fit(train, epochs=3, batch_size=20, callbacks=[stopper], verbose=0)
        assert history.epoch == [0]
    elif method == "evaluate":
        result = trainer.evaluate(val, batch_size=10, callbacks=[stopper])
        first = trainer.evaluate(_first(val, 30), batch_size=10)  # the flag is reset
        np.testing.assert_allclose(result["loss"], first["loss"], rtol=1e-6)
    else:
        outputs = trainer.predict(val, batch_size=10, callbacks=[stopper])
        np.testing.assert_array_equal(outputs, trainer.predict(val, batch_size=10)[:30])
    assert stopper.counter == 3


def test_fit_returns_a_history_given_in_callbacks(trainer, data):
    # keras: callback_list.py::_add_default_callbacks (a History in callbacks is the one fit returns)
    history = History()
    assert _fit(trainer, data, [history], epochs=1) is history
    assert trainer.history is history and history.epoch == [0]


def test_history_runs_after_the_callbacks(trainer, data, tmp_path):
    # keras: callback_list.py::_add_default_callbacks (History is appended after the user's callbacks)
    class AddsKey(Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs["doubled_loss"] = 2 * logs["loss"]

    history = _fit(trainer, data, [AddsKey()])
    np.testing.assert_allclose(
        history.history["doubled_loss"], 2 * np.asarray(history.history["loss"]), rtol=1e-7
    )
    figure = history.plot(tmp_path / "curves.png")
    assert "doubled_loss" in [ax.get_title() for ax in figure.axes]


def test_set_model(trainer):
    # keras: callback.py::set_model (set_trainer, easyfit's name, stays)
    cb = Callback()
    cb.set_model(trainer)
    assert cb.model is trainer and cb.trainer is trainer
    other = Callback()
    other.set_trainer(trainer)
    assert other.model is trainer


def test_batch_index_counts_dispatches_with_steps_per_execution(mnist_arrays):
    # keras: trainer_test.py::test_steps_per_execution_steps_count and
    # ::test_steps_per_execution_steps_count_without_training. easyfit differs on purpose
    # (docs/keras.md): batch hooks fire once per dispatch of k steps, as in Keras, but `batch`
    # counts dispatches (Keras: the first step's index at begin, the last step's at end).
    train, val = mnist_slices(mnist_arrays)
    trainer = small_trainer(steps_per_execution=2)
    seen = []

    class Index(Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(("train", batch, self.params["steps"]))

        def on_test_batch_begin(self, batch, logs=None):
            seen.append(("test", batch))

        def on_predict_batch_begin(self, batch, logs=None):
            seen.append(("predict", batch))

    trainer.fit(train, epochs=1, batch_size=20, verbose=0, callbacks=[Index()])  # 10 steps, 5 dispatches
    trainer.evaluate(val, batch_size=20, callbacks=[Index()])  # 5 steps, 3 dispatches
    trainer.predict(val, batch_size=20, callbacks=[Index()])
    assert seen == [("train", b, 5) for b in range(5)] + [("test", b) for b in range(3)] + [
        ("predict", b) for b in range(3)
    ]
