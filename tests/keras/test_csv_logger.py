"""CSVLogger, as keras/src/callbacks/csv_logger_test.py pins it down.

Keras' ``handle_value`` (writing list-valued logs) is not ported: easyfit's logs hold numbers.
"""

from __future__ import annotations

import csv

import pytest

from easyfit.callbacks import Callback, CSVLogger, TerminateOnNaN
from tests.helpers import kerasfit
from tests.helpers.kerasfit import exploding_data, mse_trainer

data, trainer = kerasfit.data, kerasfit.trainer  # the module's fixtures


def _fit(trainer, data, callbacks, epochs=1, **kw):
    train, val = data
    return trainer.fit(
        train, epochs=epochs, batch_size=100, verbose=0, validation_data=val, callbacks=callbacks, **kw
    )


def _rows(path, sep=","):
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter=sep))


def test_separator_append_and_reuse(trainer, data, tmp_path):
    # keras: csv_logger_test.py::test_CSVLogger (cases 1 to 3)
    path = tmp_path / "log.tsv"
    _fit(trainer, data, [CSVLogger(path, separator="\t")])
    with open(path) as f:
        assert csv.Sniffer().sniff(f.read()).delimiter == "\t"
    logger = CSVLogger(path, separator="\t", append=True)  # no second header
    _fit(trainer, data, [logger])
    _fit(trainer, data, [logger], epochs=2)  # the same logger, reused
    lines = path.read_text().splitlines()
    assert len(lines) == 5 and len({line.count("\t") for line in lines}) == 1
    assert " ".join(lines).count("epoch") == 1
    assert [row["epoch"] for row in _rows(path, "\t")] == ["0", "0", "0", "1"]


def test_validation_columns_with_validation_freq(trainer, data, tmp_path):
    # keras: csv_logger_test.py::test_CSVLogger (case 3: val_loss registered when validation_freq > 1)
    path = tmp_path / "log.csv"
    history = _fit(trainer, data, [CSVLogger(path)], epochs=5, validation_freq=3)
    rows = _rows(path)
    assert len(rows) == 5
    for epoch, row in enumerate(rows, 1):
        for key in ("val_loss", "val_accuracy"):
            assert row[key] == (str(history.history[key][0]) if epoch == 3 else "NA")
    assert [float(row["loss"]) for row in rows] == history.history["loss"]
    # a training-only key gets no val_ twin (docs/keras.md): validation never logs it
    assert "input_wait" in rows[0] and "val_input_wait" not in rows[0]


def test_a_key_first_logged_later_gets_its_column(trainer, data, tmp_path):
    # keras: csv_logger.py::on_epoch_end (columns from the first epoch; easyfit widens the file)
    class Late(Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                logs["late"] = 7.0

    path = tmp_path / "log.csv"
    _fit(trainer, data, [Late(), CSVLogger(path)], epochs=3)
    assert [row["late"] for row in _rows(path)] == ["NA", "7.0", "NA"]
    assert path.read_text().count("epoch") == 1


def test_stop_training_csv(mnist_arrays, tmp_path):
    # keras: csv_logger_test.py::test_stop_training_csv
    path = tmp_path / "log.csv"
    history = mse_trainer(mnist_arrays).fit(
        exploding_data(mnist_arrays),
        epochs=20,
        batch_size=50,
        shuffle=False,
        verbose=0,
        callbacks=[TerminateOnNaN(), CSVLogger(path)],
    )
    assert len(history.history["loss"]) == 1
    with open(path, newline="") as f:
        rows = [row for row in csv.reader(f) if row]
    assert len(rows) == 2 and rows[-1][rows[0].index("loss")] == "inf"


def test_append_follows_the_existing_header(trainer, data, tmp_path):
    # keras: csv_logger.py::on_train_begin (append: no second header). easyfit writes the rows
    # in the file's own columns, and warns about a key its header lacks (docs/keras.md)
    path = tmp_path / "log.csv"
    path.write_text("epoch,val_loss,loss\n0,1.5,2.5\n")
    with pytest.warns(UserWarning, match="accuracy.*not written"):
        history = _fit(trainer, data, [CSVLogger(path, append=True)])
    rows = _rows(path)
    assert list(rows[1]) == ["epoch", "val_loss", "loss"] and len(rows) == 2
    assert float(rows[1]["loss"]) == history.history["loss"][0]
    assert float(rows[1]["val_loss"]) == history.history["val_loss"][0]
