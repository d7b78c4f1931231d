"""What a newcomer from Keras meets in the first hour: errors that say the fix, an aligned
``easyfit info``, and a README whose "Ten lines" has ten."""

from __future__ import annotations

import re

import numpy as np
import optax
import pytest

import easyfit as ef
from tests.helpers import ROOT
from tests.helpers.models import SmallMLP, TinyMLP


def test_compile_says_the_constructor_takes_its_arguments():
    trainer = ef.Trainer(SmallMLP())
    with pytest.raises(AttributeError, match=r"ef\.Trainer\(model, optimizer=\.\.\., loss=\.\.\., metrics"):
        trainer.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    assert not hasattr(trainer, "compile")
    with pytest.raises(AttributeError, match="'Trainer' object has no attribute 'nope'"):
        trainer.nope  # noqa: B018 - other names: Python's usual error


def test_string_labels_get_the_fix_and_the_fix_works():
    x = np.random.default_rng(0).random((20, 4)).astype(np.float32)
    y = np.array(["cat", "dog"] * 10)
    with pytest.raises(ef.errors.DataError, match="dtype <U3 is not numeric") as info:
        ef.Trainer(SmallMLP()).fit(x, y, batch_size=10, verbose=0)
    assert "np.unique(y, return_inverse=True)" in str(info.value)
    assert "class_names=list(names)" in str(info.value)
    names, y = np.unique(y, return_inverse=True)  # the fix the message gives
    trainer = ef.Trainer(SmallMLP())
    history = trainer.fit(ef.data.Arrays(x, y, class_names=list(names)), batch_size=10, verbose=0)
    assert trainer.class_names == ["cat", "dog"] and len(history.history["loss"]) == 1
    assert repr(trainer.class_names) == "['cat', 'dog']"  # plain str, not np.str_('cat')


def test_info_values_start_in_one_column():
    from easyfit._info import collect, report

    rows = [line for line in report(collect()).splitlines() if not line.startswith(("warning:", "no "))]
    assert any(line.startswith("CUDA_DEVICE_MAX_CONNECTIONS ") for line in rows)
    assert len({re.match(r"\S+\s+", line).end() for line in rows}) == 1, rows


def test_readme_ten_lines_are_ten():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Ten lines", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len([line for line in code.splitlines() if line.strip()]) == 10


def test_a_first_fit_on_uint8_pixels_says_they_are_unscaled_and_prints_as_keras(capsys):
    """One tiny fit: the unscaled-pixels note (once), the cache note's size in KiB (not
    "0 MiB"), the loss note, and numbers at or below 1e-3 in Keras' %.4e (the learning rate)."""
    x, y = ef.datasets.sample()["train"]
    trainer = ef.Trainer(TinyMLP(), optimizer=optax.inject_hyperparams(optax.adam)(learning_rate=2.5e-4))
    trainer.fit(x[:16], y[:16], epochs=1, batch_size=8, verbose=2)
    out = capsys.readouterr().out
    note = (
        "easyfit: x is uint8 with values up to 255 and no scale: the model sees them as they are "
        "(as in Keras); for pixels in [0, 1] pass ef.data.Arrays(x, y, scale=1/255) to fit"
    )
    assert out.count(note) == 1, out
    assert "(12 KiB per device, budget " in out  # 16 images of 784 bytes
    assert (
        "loss='sparse_categorical_crossentropy' (none given; integer labels, read as class indices)\n" in out
    )
    epoch = next(line for line in out.splitlines() if line.startswith("Epoch 1/1"))
    assert " - learning_rate: 2.5000e-04 - " in epoch, epoch  # Keras' progbar: %.4e at or below 1e-3


def test_numbers_in_the_logs_are_formatted_as_keras_progbar_does(capsys):
    """keras/src/utils/progbar.py: ``%.4f`` when ``abs(v) > 1e-3``, else ``%.4e``: the epoch
    line and the lines under a bar alike."""
    from easyfit.callbacks import ProgbarLogger
    from easyfit.callbacks.progbar import metric_lines

    logs = {"loss": 0.25, "learning_rate": 9.87e-6, "lr": 2.5e-4, "big": 12.0, "zero": 0.0, "neg": -0.5}
    expected = (
        "loss: 0.2500 - learning_rate: 9.8700e-06 - lr: 2.5000e-04 - big: 12.0000 - zero: 0.0000e+00"
        " - neg: -0.5000"
    )
    assert metric_lines(logs, None, indent="") == [expected]
    bar = ProgbarLogger(verbose=2)
    bar.set_params({"epochs": 3})
    bar.on_epoch_begin(0)
    bar.on_epoch_end(0, logs)
    line = capsys.readouterr().out.strip()
    assert re.fullmatch(r"Epoch 1/3 - \d+\.\ds - " + re.escape(expected), line), line


def test_one_image_without_its_batch_axis_is_said_to_be(mnist_arrays):
    """An image of the trained shape (28, 28, 1), or (28, 28) for grayscale, given alone: the
    message says to add the batch axis, not to resize; the fix it gives works."""
    from easyfit.data.recipe import ImageRecipe

    recipe = ImageRecipe(image_size=(28, 28), resize=False, color_mode="grayscale")
    image = mnist_arrays["val"][0][0]
    with pytest.raises(ef.errors.DataError) as info:
        ef.data.Arrays(image, images=recipe)
    assert str(info.value) == (
        "x has shape (28, 28, 1), one image of the trained shape: add the batch axis, x[None] "
        "(an array's first axis counts the images)"
    )
    assert len(ef.data.Arrays(image[None], images=recipe)) == 1
    with pytest.raises(ef.errors.DataError, match=r"add the batch and channel axes, x\[None, \.\.\., None\]"):
        ef.data.Arrays(image[..., 0], images=recipe)
    assert len(ef.data.Arrays(image[..., 0][None, ..., None], images=recipe)) == 1
    rgb = ImageRecipe(image_size=(32, 32), resize=True, color_mode="rgb")
    with pytest.raises(ef.errors.DataError, match=r"x has shape \(40, 50, 3\), one image .*x\[None\]"):
        ef.data.Arrays(np.zeros((40, 50, 3), np.uint8), images=rgb)


def test_image_size_hints_say_where_it_goes(tmp_path):
    """``fit`` takes no image_size: every hint shows the source that does."""
    from PIL import Image

    where = r"ef\.data\.ImageFolder\(path, image_size=\(h, w\)"
    for name, size in (("a", (28, 28)), ("b", (32, 30))):
        (tmp_path / "digit").mkdir(exist_ok=True)
        Image.new("L", size).save(tmp_path / "digit" / f"{name}.png")
    with pytest.raises(ef.errors.DataError, match=r"images differ in size .*; resize them all: " + where):
        ef.data.ImageFolder(tmp_path)
    with pytest.raises(ValueError, match="random_resized_crop needs image_size, .*" + where):
        ef.data.ImageFolder(tmp_path, augment=ef.data.Augment(random_resized_crop=(0.5, 1.0)))
    (tmp_path / "digit" / "b.png").unlink()  # one size: the next check is reached
    with pytest.raises(ValueError, match=r"crop_to_aspect_ratio=True: needs image_size, .*" + where):
        ef.data.ImageFolder(tmp_path, crop_to_aspect_ratio=True)


def test_an_nnx_optimizer_gets_a_short_message_naming_the_optax_one():
    from flax import nnx

    tutorial = nnx.Optimizer(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), optax.adam(1e-3), wrt=nnx.Param)
    with pytest.raises(ValueError) as info:
        ef.Trainer(TinyMLP(), optimizer=tutorial)
    message = str(info.value)
    assert len(message.splitlines()) <= 2 and len(message) < 200, message
    assert "optimizer=optax.adam(1e-3)" in message and "not the nnx.Optimizer" in message
    assert "OptState" not in message  # no repr of the optimizer
    with pytest.raises(ValueError, match=r"^optimizer=<dict>: expected a Keras optimizer name"):
        ef.Trainer(TinyMLP(), optimizer={str(i): i for i in range(40)})
