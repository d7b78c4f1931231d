"""Bad input raises DataError naming the path or argument."""

from __future__ import annotations

import os

import numpy as np
import pytest

import easyfit as ef
from tests.helpers.models import SmallMLP


def test_missing_directory(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ef.errors.DataError, match=f"{missing}: no such directory"):
        ef.Trainer(SmallMLP()).fit(str(missing))


def test_no_class_folders(tmp_path):
    (tmp_path / "a.png").write_bytes(b"")
    with pytest.raises(ef.errors.DataError, match="no class folders"):
        ef.data.ImageFolder(tmp_path)


def test_class_folder_without_images(tmp_path, mnist_dir):
    for c in ("cat", "dog"):
        (tmp_path / c).mkdir()
    src = os.path.join(mnist_dir, "train", "0")
    first = sorted(os.listdir(src))[0]
    (tmp_path / "cat" / first).write_bytes(open(os.path.join(src, first), "rb").read())
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    with pytest.raises(ef.errors.DataError, match=f"{tmp_path / 'dog'}: class folder with no images"):
        ef.data.ImageFolder(tmp_path)


def test_no_images_at_all(tmp_path):
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
    with pytest.raises(ef.errors.DataError, match="no images in any class folder"):
        ef.data.ImageFolder(tmp_path)


def test_images_of_different_sizes_ask_for_image_size(tmp_path):
    for c, size in (("a", (8, 8)), ("b", (10, 12))):
        (tmp_path / c).mkdir()
        ef.datasets.write_png(tmp_path / c / "x.png", np.zeros(size, np.uint8))
    with pytest.raises(ef.errors.DataError, match="image_size"):
        ef.data.ImageFolder(tmp_path)
    folder = ef.data.ImageFolder(tmp_path, image_size=(9, 9))
    assert folder.image_shape == (9, 9, 1)


def test_data_error_is_a_value_error():
    assert issubclass(ef.errors.DataError, ValueError)


def test_mnist_helper_never_overwrites_a_foreign_folder(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not empty"):
        ef.datasets.mnist(tmp_path, limit=(10, 10))
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_rgb_and_inferred_color_mode(tmp_path):
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(3):
            ef.datasets.write_png(tmp_path / c / f"{i}.png", rng.integers(0, 255, (6, 5, 3), dtype=np.uint8))
    folder = ef.data.ImageFolder(tmp_path)
    assert folder.color_mode == "rgb" and folder.image_shape == (6, 5, 3)
    gray = ef.data.ImageFolder(tmp_path, color_mode="grayscale")
    assert gray.image_shape == (6, 5, 1)


def _folder(root, classes):
    for c in classes:
        (root / c).mkdir(parents=True)
        ef.datasets.write_png(root / c / "0.png", np.full((4, 4), 10 * len(c), np.uint8))
    return root


def test_validation_folder_takes_the_training_classes(tmp_path):
    train = ef.data.ImageFolder(_folder(tmp_path / "train", ["a", "b", "c"]))
    val = ef.data.to_source(str(_folder(tmp_path / "val", ["a", "c"])), like=train)
    assert val.class_names == ["a", "b", "c"]
    assert val.labels.tolist() == [0, 2]  # "c" keeps its training label despite "b" missing
    with pytest.raises(ef.errors.DataError, match="not one of the classes"):
        ef.data.to_source(str(_folder(tmp_path / "other", ["a", "z"])), like=train)


def test_argument_mistakes_are_value_or_type_errors_naming_the_argument(tmp_path):
    """DataError is for bad data only: a wrong argument raises ValueError or TypeError."""
    (tmp_path / "a").mkdir()
    ef.datasets.write_png(tmp_path / "a" / "x.png", np.zeros((8, 8), np.uint8))
    trainer = ef.Trainer(SmallMLP())
    mistakes = [
        (ValueError, "brightness=2", lambda: ef.data.Augment(brightness=2)),
        (ValueError, "crop_padding", lambda: ef.data.Augment(crop_padding=-1)),
        (ValueError, "color_mode='sepia'", lambda: ef.data.ImageFolder(tmp_path, color_mode="sepia")),
        (ValueError, "decoder='gpu'", lambda: ef.data.ImageFolder(tmp_path, decoder="gpu")),
        (ValueError, "image_size=", lambda: ef.data.ImageFolder(tmp_path, image_size=(0,))),
        (ValueError, "batch_size=0", lambda: ef.parallel.Placement.create().check_batch_size(0)),
        (
            ValueError,
            "validation_split=1.5",
            lambda: ef.data.split_validation(ef.data.ImageFolder(tmp_path), 1.5),
        ),
        (ValueError, "^y: not used", lambda: ef.data.to_source(str(tmp_path), [1])),
        # fit's and evaluate's y beside a path (whose labels come from its data) is refused too,
        # not dropped: as Keras refuses y beside a dataset
        (ValueError, "^y: not used with a path", lambda: trainer.fit(str(tmp_path), [1], verbose=0)),
        (ValueError, "^y: not used with a path", lambda: trainer.evaluate(str(tmp_path), [1], verbose=0)),
        (
            ValueError,
            "^validation_data: y is not used with a path",
            lambda: trainer.fit(str(tmp_path), validation_data=(str(tmp_path), [1]), verbose=0),
        ),
        (TypeError, "^x: object is not supported", lambda: ef.data.to_source(object())),
    ]
    for kind, message, call in mistakes:
        with pytest.raises(kind, match=message) as raised:
            call()
        assert not isinstance(raised.value, ef.errors.DataError), message


def test_inputs_only_iterated_or_already_batched_are_refused_saying_what_is_supported():
    """A generator, an iterator, a list of batches, tf.data- and torch-like objects: a TypeError
    naming the argument and the kind, what to do instead and the kinds easyfit takes."""
    x, y = np.zeros((8, 4), np.float32), np.arange(8) % 2
    batches = [(x[:5], y[:5]), (x[5:], y[5:])]

    class DatasetLike:  # tf.data.Dataset's interface (TensorFlow is not installed here)
        element_spec = None

        def as_numpy_iterator(self):
            return iter(batches)

    class DataLoader:  # torch.utils.data.DataLoader's
        dataset, batch_size = None, 4

        def __iter__(self):
            return iter(batches)

    trainer = ef.Trainer(SmallMLP())
    cases = [
        ("x: a Python generator of batches", lambda: trainer.fit((b for b in batches), verbose=0)),
        ("x: a list of batches \\(tuples\\)", lambda: trainer.fit(batches, verbose=0)),
        ("x: a list of batches \\(dicts\\)", lambda: trainer.fit([{"x": x, "y": y}], verbose=0)),
        ("x: a list of 2 arrays of different shapes", lambda: trainer.predict([x[:5], x[5:]])),
        ("x: a Python iterator of batches", lambda: trainer.evaluate(iter(batches))),
        ("x: a tf.data.Dataset", lambda: trainer.fit(DatasetLike(), verbose=0)),
        ("x: a torch DataLoader", lambda: trainer.fit(DataLoader(), verbose=0)),
        (
            "validation_data: a Python generator",
            lambda: trainer.fit(x, y, validation_data=(b for b in batches), verbose=0),
        ),
        ("x: object is not supported", lambda: ef.data.to_source(object())),
    ]
    for message, call in cases:
        with pytest.raises(TypeError, match="^" + message) as raised:
            call()
        text = str(raised.value)
        assert "Supported: a folder or file path" in text and "docs/data.md" in text, text
    assert ef.data.to_source([[0.0, 1.0], [2.0, 3.0]], [0, 1]).x.shape == (2, 2)  # rows: arrays
