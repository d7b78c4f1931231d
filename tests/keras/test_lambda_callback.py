"""LambdaCallback, as keras/src/callbacks/lambda_callback_test.py pins it down (the hooks
record their calls instead of logging warnings)."""

from __future__ import annotations

import pytest

from easyfit.callbacks import LambdaCallback
from tests.helpers import kerasfit

data, trainer = kerasfit.data, kerasfit.trainer  # the module's fixtures


def _fit(trainer, data, callback, epochs=2):
    train, val = data
    trainer.fit(train, epochs=epochs, batch_size=100, verbose=0, validation_data=val, callbacks=[callback])


def test_lambda_callback(trainer, data):
    # keras: lambda_callback_test.py::test_lambda_callback
    calls = []
    cb = LambdaCallback(
        on_train_begin=lambda logs: calls.append("on_train_begin"),
        on_epoch_begin=lambda epoch, logs: calls.append("on_epoch_begin"),
        on_epoch_end=lambda epoch, logs: calls.append("on_epoch_end"),
        on_train_end=lambda logs: calls.append("on_train_end"),
    )
    _fit(trainer, data, cb)
    assert calls == ["on_train_begin", *["on_epoch_begin", "on_epoch_end"] * 2, "on_train_end"]


def test_lambda_callback_with_batches(trainer, data):
    # keras: lambda_callback_test.py::test_lambda_callback_with_batches
    calls = []
    cb = LambdaCallback(
        on_train_batch_begin=lambda batch, logs: calls.append(("begin", batch)),
        on_train_batch_end=lambda batch, logs: calls.append(("end", batch)),
    )
    _fit(trainer, data, cb, epochs=1)
    assert calls == [("begin", 0), ("end", 0), ("begin", 1), ("end", 1)]


def test_lambda_callback_with_kwargs(trainer, data):
    # keras: lambda_callback_test.py::test_lambda_callback_with_kwargs
    calls = []
    trainer.evaluate(
        data[1], batch_size=100, callbacks=[LambdaCallback(on_test_begin=lambda logs: calls.append(logs))]
    )
    assert calls == [{}]


def test_lambda_callback_no_args():
    # keras: lambda_callback_test.py::test_lambda_callback_no_args
    assert isinstance(LambdaCallback(), LambdaCallback)


def test_lambda_callback_with_additional_kwargs():
    # keras: lambda_callback_test.py::test_lambda_callback_with_additional_kwargs
    def custom_callback(logs):
        pass

    cb = LambdaCallback(custom_method=custom_callback)
    assert cb.custom_method is custom_callback
    with pytest.warns(UserWarning, match="on_epoch_ending is not a callback hook"):
        LambdaCallback(on_epoch_ending=print)  # a typo of a hook name is accepted, as in Keras, with a word


def test_lambda_callback_during_prediction(trainer, data):
    # keras: lambda_callback_test.py::test_lambda_callback_during_prediction
    calls = []
    cb = LambdaCallback(
        on_predict_begin=lambda logs: calls.append("begin"),
        on_predict_batch_end=lambda batch, logs: calls.append(sorted(logs)),
    )
    trainer.predict(data[1], batch_size=100, callbacks=[cb])
    assert calls == ["begin", ["outputs"]]


def test_lambda_callback_any_hook(trainer, data):
    # keras: lambda_callback.py (kwargs: any function of Callback, e.g. on_batch_end)
    calls = []
    _fit(trainer, data, LambdaCallback(on_batch_end=lambda batch, logs: calls.append(batch)), epochs=1)
    assert calls == [0, 1]
