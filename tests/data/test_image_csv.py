"""Images with float targets from a CSV file: regression through fit (issue 15)."""

from __future__ import annotations

import numpy as np
import optax
import pytest

import easyfit as ef
from tests.helpers.dense import Regressor, write_image_csv


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """train.csv (20 images) and val.csv (10) in one folder, targets (brightness, 1 - it)."""
    folder = tmp_path_factory.mktemp("csv")
    train = write_image_csv(folder / "train", 20, seed=0, name="train.csv")
    val = write_image_csv(folder / "val", 10, seed=1, name="val.csv")
    return train, val


def test_regression_from_a_csv_through_fit_evaluate_and_predict(tables):
    (train_csv, _), (val_csv, val_targets) = tables
    train = ef.data.ImageCSV(train_csv)
    assert train.target_names == ["bright", "dark"] and train.label_dtype == np.float32
    assert ef.data.detect(val_csv) is ef.data.ImageCSV
    trainer = ef.Trainer(Regressor(), optimizer=optax.adam(0.1), seed=0)
    history = trainer.fit(train, validation_data=val_csv, epochs=5, batch_size=4, verbose=0)
    assert trainer.loss == "mse"  # ImageCSV.default_loss, though each row (t, 1 - t) sums to 1
    losses = history.history["loss"]
    assert losses[-1] < 0.2 * losses[0], losses
    assert len(history.history["val_loss"]) == 5
    outputs = trainer.predict(val_csv, batch_size=4)  # 10 rows in batches of 4: padding masked
    assert outputs.shape == (10, 2)
    logs = trainer.evaluate(val_csv, batch_size=4)
    hand = ((outputs.astype(np.float64) - val_targets) ** 2).mean(axis=1).mean()
    np.testing.assert_allclose(logs["loss"], hand, rtol=1e-5)


def test_file_names_relative_to_a_root(tmp_path):
    csv, targets = write_image_csv(tmp_path / "data", 3)
    moved = tmp_path / "elsewhere.csv"
    moved.write_text(open(csv).read())
    data = ef.data.ImageCSV(moved, root=tmp_path / "data", image_size=(4, 4))
    assert data.files[0] == str(tmp_path / "data" / "img" / "000.png")
    np.testing.assert_array_equal(data.targets, targets)
    assert data.image_shape == (4, 4, 1)
    with pytest.raises(ef.errors.DataError, match=rf"^{moved}, line 2: {tmp_path}/img/000.png: no such file"):
        ef.data.ImageCSV(moved)


@pytest.mark.parametrize(
    "text, message",
    [
        ("file,t\nimg/000.png,1\nimg/404.png,2\n", r"line 3: .*/img/404.png: no such file"),
        ("file,t,u\nimg/000.png,1,2\nimg/001.png,1,abc\n", r"line 3, column 'u': 'abc' is not a number"),
        ("file,t\nimg/000.png,nan\n", r"line 2, column 't': 'nan' is not finite"),
        (
            "file,t,u\nimg/000.png,1,2\nimg/001.png,1\n",
            r"line 3: 2 cells, but the header has 3 \(a file name and 2 targets\)",
        ),
        ("img/000.png,1,2\nimg/001.png,1,2\n", r"line 1: 'img/000.png,1,2' looks like data"),
        ("file,t\n", r"no rows after the header"),
        ("file\nimg/000.png\n", r"expected a header row"),
    ],
    ids=["missing-file", "not-a-number", "nan", "short-row", "no-header", "no-rows", "no-targets"],
)
def test_bad_csv_files_are_named_with_line_and_column(tmp_path, text, message):
    write_image_csv(tmp_path, 2)
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ef.errors.DataError, match=rf"^{path}(, |: ){message}"):
        ef.data.ImageCSV(path)


def test_a_validation_csv_with_other_targets_is_refused(tables, tmp_path):
    (train_csv, _), _ = tables
    other = tmp_path / "other.csv"
    write_image_csv(tmp_path, 2)
    other.write_text("file,age\nimg/000.png,1\nimg/001.png,2\n")
    train = ef.data.ImageCSV(train_csv)
    with pytest.raises(ef.errors.DataError, match=rf"^{other}: targets \['age'\], but those of"):
        train.sibling(other)
