"""A saved model predicts what the trained one predicted: the training data's input recipe (image
size, colour mode, scale, normalisation, evaluation's resize and crop, class names; the structure
of array inputs) travels with checkpoints and exports, and raw arrays are read as files are."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn
from PIL import Image

import easyfit as ef
from easyfit.persistence import checkpoint_files as _integrity
from tests.helpers import last_json, run_program
from tests.helpers.formats import encode
from tests.helpers.models import SmallMLP

NORMALIZE = (0.5, 0.25)


class Linear(nn.Module):
    """Logits linear in the pixels: a small change of the inputs is a small change of them."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(x.reshape((x.shape[0], -1)))


def _pixels(folder: str) -> np.ndarray:
    """The images of a class folder, in the source's order, as one uint8 NHWC array."""
    files = sorted(glob.glob(os.path.join(folder, "*", "*.png")))
    return np.stack([np.asarray(Image.open(f)).reshape(28, 28, -1) for f in files])


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    return ef.datasets.sample_folder(tmp_path_factory.mktemp("recipe") / "mnist", limit=(200, 100))


@pytest.fixture(scope="module")
def normalized(mnist, tmp_path_factory):
    """A model trained on the MNIST folder with ``normalize=(0.5, 0.25)``, with SGD, saved."""
    trainer = ef.Trainer(SmallMLP(), optimizer="sgd", seed=0)
    trainer.fit(
        ef.data.ImageFolder(mnist + "/train", normalize=NORMALIZE), epochs=1, batch_size=50, verbose=0
    )
    path = trainer.save(tmp_path_factory.mktemp("ckpt") / "normalized")
    return trainer, path, trainer.predict(mnist + "/val")


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 4])
def test_a_loaded_model_predicts_and_evaluates_what_the_trained_one_did(tmp_path, devices):
    # a folder of varied sizes under a crop recipe (loaded by save, ModelCheckpoint and
    # BackupAndRestore; with load and from_checkpoint), an LMDB and arrays
    r = last_json(run_program("recipe_devices.py", str(tmp_path), devices=devices))
    assert r["devices"] == devices
    for kind in ("folder", "lmdb", "arrays"):
        for how, got in r[kind].items():
            assert got["predict"] <= 1e-5, (kind, how, got)  # the same computation on CPU
            if "evaluate" in got:
                assert got["evaluate"] <= 1e-5 and got["accuracy"] > 0.5, (kind, how, got)
    images = r["recipe"]["images"]
    assert images["image_size"] == [16, 16] and images["resize"] and images["color_mode"] == "rgb"
    assert images["eval_crop"] == 0.875 and images["resize_shorter"] == 18
    assert images["mean"] == [0.5, 0.4, 0.3] and images["std"] == [0.25, 0.2, 0.3]
    assert r["recipe"]["class_names"] == ["a", "b", "c"]
    arrays = r["arrays_recipe"]
    assert arrays["scale"] == pytest.approx(1 / 255) and arrays["inputs"]["shapes"] == [[16, 16, 3]]


def test_the_recipe_is_plain_json_under_the_checksums(normalized):
    _, path, _ = normalized
    with open(os.path.join(path, "metadata", "metadata")) as f:
        recipe = json.load(f)["recipe"]
    assert recipe["images"]["mean"] == [0.5] and recipe["images"]["std"] == [0.25]
    assert recipe["images"]["image_size"] == [28, 28] and recipe["images"]["color_mode"] == "grayscale"
    assert recipe["class_names"] == [str(d) for d in range(10)]
    edited = path + "-edited"
    shutil.copytree(path, edited)
    meta_file = os.path.join(edited, "metadata", "metadata")
    with open(meta_file) as f:
        meta = json.load(f)
    meta["recipe"]["images"]["std"] = [0.3]
    with open(meta_file, "w") as f:
        json.dump(meta, f)
    with pytest.raises(ef.errors.CheckpointError, match="'metadata' does not match its checksum"):
        ef.Trainer.from_checkpoint(edited, SmallMLP())


def test_load_and_from_checkpoint_read_the_folder_as_training_did(normalized, mnist):
    trainer, path, want = normalized
    loaded = ef.Trainer(SmallMLP())
    loaded.load(path)
    np.testing.assert_allclose(loaded.predict(mnist + "/val"), want, rtol=0, atol=1e-5)
    again = ef.Trainer.from_checkpoint(path, SmallMLP())
    got, ref = again.evaluate(mnist + "/val"), trainer.evaluate(mnist + "/val")
    assert got == pytest.approx(ref, abs=1e-5)


def test_a_uint8_array_is_prepared_as_the_files_were(normalized, mnist):
    trainer, path, want = normalized
    images = _pixels(mnist + "/val")  # the PNGs' own pixels: the same images as the files
    loaded = ef.Trainer.from_checkpoint(path, SmallMLP())
    np.testing.assert_allclose(loaded.predict(images), want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(trainer.predict(images), want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(loaded.predict(images[..., 0]), want, rtol=0, atol=1e-5)  # (n, 28, 28)


def test_float_arrays_are_taken_as_already_prepared(normalized, mnist):
    _, path, want = normalized
    prepared = (_pixels(mnist + "/val") / 255 - NORMALIZE[0]) / NORMALIZE[1]
    loaded = ef.Trainer.from_checkpoint(path, SmallMLP())
    # the folder's inputs arrive as float16 (rounded to 2**-11 of their size); these as float32
    np.testing.assert_allclose(loaded.predict(prepared.astype(np.float32)), want, rtol=0, atol=2e-2)


def test_an_array_of_another_size_gets_the_resize_and_crop_of_evaluation(mnist, tmp_path):
    source = ef.data.ImageFolder(mnist + "/train", image_size=(24, 24), eval_crop=0.875, normalize=NORMALIZE)
    trainer = ef.Trainer(SmallMLP(), optimizer="sgd", seed=0)
    trainer.fit(source, epochs=1, batch_size=50, verbose=0)
    loaded = ef.Trainer.from_checkpoint(trainer.save(tmp_path / "ckpt"), SmallMLP())
    small = _pixels(mnist + "/val")[:20]
    large = np.repeat(np.repeat(small, 2, axis=1), 2, axis=2)  # 56x56
    for name, images in (("28", small), ("56", large)):
        folder = tmp_path / name
        for i, img in enumerate(images):
            os.makedirs(folder / "0", exist_ok=True)
            (folder / "0" / f"{i:02d}.png").write_bytes(encode(img))
        want = trainer.predict(str(folder))  # resized to 27 on the shorter side, 24x24 taken
        np.testing.assert_allclose(loaded.predict(images), want, rtol=0, atol=1e-5)


class Pixels(nn.Module):
    """The inputs as the model receives them (and a parameter: a state needs one)."""

    @nn.compact
    def __call__(self, x):
        return x.reshape((x.shape[0], -1)) + self.param("zero", nn.initializers.zeros, ())


def test_the_interpolation_reaches_dali_and_travels_with_the_recipe(mnist):
    """ImageFolder(interpolation=) resizes with DALI's filter of that name: upscaled from 28 to
    40, bicubic pixels are PIL's bicubic ones (not its bilinear ones), bilinear ones the reverse;
    the recipe carries it, and a uint8 array is prepared alike; a filter DALI lacks (Keras'
    "area", PIL's box of a Hugging Face config) is named."""
    val = mnist + "/val"
    pixels = _pixels(val)
    filters = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}
    pil = {
        name: np.stack([np.asarray(Image.fromarray(p[..., 0]).resize((40, 40), f)) for p in pixels])
        for name, f in filters.items()
    }
    got = {}
    for name in filters:
        source = ef.data.ImageFolder(val, image_size=(40, 40), interpolation=name)
        trainer = ef.Trainer(Pixels())
        got[name] = trainer.predict(source).reshape(-1, 40, 40) * 255
        assert source.recipe()["images"]["interpolation"] == name
        again = ef.data.ImageFolder.from_recipe(val, source.recipe())
        assert again.image_recipe().interpolation == name
        # the trainer adopted the folder's recipe: a uint8 array is resized with the same filter
        np.testing.assert_allclose(trainer.predict(pixels).reshape(-1, 40, 40) * 255, got[name], atol=1e-3)
    # mean absolute difference in grey levels: under 0.5 from PIL's same filter, over 1.5 from the other
    far = {name: {other: np.abs(got[name] - pil[other]).mean() for other in pil} for name in got}
    assert far["bicubic"]["bicubic"] < 0.5 < 1.5 < far["bicubic"]["bilinear"], far
    assert far["bilinear"]["bilinear"] < 0.5 < 1.5 < far["bilinear"]["bicubic"], far
    with pytest.raises(ValueError, match="interpolation='area': DALI's resize has no such filter"):
        ef.data.ImageFolder(val, image_size=(40, 40), interpolation="area")
    hf = {"image_mean": [0.5], "image_std": [0.5], "size": {"height": 32, "width": 32}, "resample": 4}
    pre = ef.models.Preprocessing.from_config(hf)
    with pytest.raises(ValueError, match="interpolation='box'"):
        ef.data.ImageFolder(val, **pre.image_folder_kwargs())


def test_an_array_of_another_size_without_a_resize_names_the_expected_shape(normalized):
    _, path, _ = normalized
    loaded = ef.Trainer.from_checkpoint(path, SmallMLP())
    with pytest.raises(ef.errors.DataError, match=r"20x20.*\(n, 28, 28, 1\)"):
        loaded.predict(np.zeros((4, 20, 20, 1), np.uint8))


def test_a_different_number_of_channels_is_an_error(normalized):
    _, path, _ = normalized
    loaded = ef.Trainer.from_checkpoint(path, SmallMLP())
    with pytest.raises(ef.errors.DataError, match=r"\(4, 28, 28, 3\).*grayscale.*\(n, 28, 28, 1\)"):
        loaded.predict(np.zeros((4, 28, 28, 3), np.uint8))
    with pytest.raises(ef.errors.DataError, match=r"\(4, 28, 28, 3\).*grayscale.*\(n, 28, 28, 1\)"):
        loaded.predict(np.zeros((4, 28, 28, 3), np.float32))


def test_class_folders_that_differ_from_the_recorded_ones_name_both_lists(normalized, mnist, tmp_path):
    _, path, _ = normalized
    other = tmp_path / "other"
    for name, source in (("0", "0"), ("cat", "1")):
        os.makedirs(other / name)
        for f in sorted(glob.glob(f"{mnist}/val/{source}/*.png"))[:3]:
            os.link(f, other / name / os.path.basename(f))
    loaded = ef.Trainer.from_checkpoint(path, SmallMLP())
    with pytest.raises(ef.errors.DataError) as e:
        loaded.evaluate(str(other))
    message = str(e.value)
    assert "'cat'" in message and "['0', '1', '2'" in message and "['0', 'cat']" in message


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """JPEGs of varied sizes in three classes (smooth pictures, as photos are)."""
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("jpegs")
    for split, n in (("train", 60), ("val", 24)):
        for i in range(n):
            label = int(rng.integers(0, 3))
            h, w = (int(v) for v in rng.integers(20, 40, 2))
            yy, xx = np.mgrid[0:h, 0:w]
            img = np.stack([xx * 255 / w, yy * 255 / h, np.full((h, w), 128.0)], -1)
            img[..., label] = 0.5 * img[..., label] + 120
            folder = root / split / "abc"[label]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:03d}.jpg").write_bytes(
                encode(img.clip(0, 255).astype(np.uint8), "jpeg", quality=95)
            )
    return root


#: The server of docs/models.md ("Serving"), its ``prepare`` the same: Pillow, as model.json says.
SERVER = """
import importlib.abc, json, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "easyfit" or name.startswith("nvidia"):
            raise ImportError(f"{name} is not importable here")
sys.meta_path.insert(0, Refuse())
import jax, numpy as np
from PIL import Image

export, files = sys.argv[1], sys.argv[2:]
fn = jax.export.deserialize(bytearray(open(export + "/model.stablehlo", "rb").read())).call
recipe = json.load(open(export + "/model.json"))["recipe"]["images"]


def prepare(file):
    h, w = recipe["image_size"]
    image = Image.open(file).convert("L" if recipe["channels"] == 1 else "RGB")
    if recipe["cover"]:  # evaluation's center crop
        scale = max(recipe["cover"][0] / image.height, recipe["cover"][1] / image.width)
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.BILINEAR)
        left, top = (image.width - w + 1) // 2, (image.height - h + 1) // 2
        image = image.crop((left, top, left + w, top + h))
    elif recipe["resize"]:
        image = image.resize((w, h), Image.BILINEAR)
    return np.asarray(image).reshape(h, w, recipe["channels"])


out = np.asarray(fn(np.stack([prepare(f) for f in files])))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("easyfit", "nvidia"))
classes = json.load(open(export + "/model.json"))["class_names"]
print(json.dumps({"out": out.tolist(), "loaded": loaded, "classes": classes}))
"""


def test_an_export_takes_uint8_images_and_a_plain_jax_server_matches_predict(jpegs, tmp_path):
    source = ef.data.ImageFolder(jpegs / "train", image_size=(16, 16), eval_crop=0.875, normalize="imagenet")
    trainer = ef.Trainer(Linear(), optimizer=optax.adam(1e-3), seed=0)
    trainer.fit(source, epochs=1, batch_size=12, verbose=0)
    path = trainer.export(tmp_path / "exported")
    with open(os.path.join(path, "model.json")) as f:
        meta = json.load(f)
    assert meta["input_shape"] == [None, 16, 16, 3] and meta["input_dtype"] == "uint8"
    images = meta["recipe"]["images"]
    assert images["mean"] == [0.485, 0.456, 0.406] and images["resize_shorter"] == 18
    assert "center 16x16" in meta["recipe"]["preprocessing"]
    files = ef.data.ImageFolder(jpegs / "val", image_size=(16, 16)).files  # predict's order
    proc = subprocess.run(
        [sys.executable, "-I", "-c", SERVER, path, *files], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["loaded"] == [] and got["classes"] == ["a", "b", "c"]
    want = trainer.predict(str(jpegs / "val"))
    # Pillow's bilinear resize and DALI's differ by a few levels of 255 at some pixels
    np.testing.assert_allclose(np.asarray(got["out"]), want, rtol=0, atol=0.05 * np.abs(want).max())
    assert (np.asarray(got["out"]).argmax(1) == want.argmax(1)).mean() >= 0.9


def test_an_export_of_prepared_inputs_is_still_available(normalized, mnist, tmp_path):
    trainer, _, want = normalized
    path = trainer.export(tmp_path / "prepared", inputs="prepared")
    fn, meta = ef.persistence.export.load_exported(path)
    assert meta["input_dtype"] == "float16"
    prepared = ((_pixels(mnist + "/val") / 255 - NORMALIZE[0]) / NORMALIZE[1]).astype(np.float16)
    np.testing.assert_allclose(np.asarray(fn(prepared)), want, rtol=0, atol=2e-2)
    fn, meta = ef.persistence.export.load_exported(trainer.export(tmp_path / "images"))
    assert meta["input_dtype"] == "uint8"
    np.testing.assert_allclose(np.asarray(fn(_pixels(mnist + "/val"))), want, rtol=0, atol=1e-5)


def _pre_recipe_checkpoint(trainer: ef.Trainer, path: str) -> str:
    """A checkpoint as easyfit wrote them before recipes: no ``recipe`` and no ``optimizer``
    in its metadata (the checksums written over that metadata)."""
    args = ef.checkpoint.checkpoint_args(trainer.state, trainer.progress, trainer.checkpoint_meta)
    meta = {k: v for k, v in args["metadata"].item.items() if k not in ("recipe", "optimizer")}
    sums = {**args[_integrity.ITEM].item, "metadata": _integrity.json_digest(meta)}
    items = {**args, "metadata": ocp.args.JsonSave(meta), _integrity.ITEM: ocp.args.JsonSave(sums)}
    ocp.Checkpointer(ocp.CompositeCheckpointHandler()).save(path, args=ocp.args.Composite(**items))
    return path


def test_an_older_checkpoint_loads_warns_and_reads_with_default_settings(normalized, mnist, tmp_path):
    trainer, _, _ = normalized
    path = _pre_recipe_checkpoint(trainer, str(tmp_path / "old"))
    assert "recipe" not in ef.checkpoint.read_metadata(path)
    with pytest.warns(UserWarning, match="carries no input recipe"):
        loaded = ef.Trainer.from_checkpoint(path, SmallMLP(), optimizer="sgd")
    defaults = trainer.predict(ef.data.ImageFolder(mnist + "/val"))  # as before: no normalize
    np.testing.assert_allclose(loaded.predict(mnist + "/val"), defaults, rtol=0, atol=1e-5)
    assert int(loaded.state.step) == int(trainer.state.step)


def test_from_checkpoint_without_the_optimizer_is_for_inference_and_fit_says_what_is_missing(
    normalized, mnist, tmp_path
):
    trainer, path, want = normalized  # trained with "sgd"; the default optimizer is Adam
    loaded = ef.Trainer.from_checkpoint(path, SmallMLP())
    np.testing.assert_allclose(loaded.predict(mnist + "/val"), want, rtol=0, atol=1e-5)
    assert loaded.evaluate(mnist + "/val") == pytest.approx(trainer.evaluate(mnist + "/val"), abs=1e-5)
    fn, _ = ef.persistence.export.load_exported(loaded.export(tmp_path / "exported"))
    np.testing.assert_allclose(np.asarray(fn(_pixels(mnist + "/val"))), want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"for inference only.*'sgd'.*optimizer='sgd'"):
        loaded.fit(mnist + "/train", epochs=1, verbose=0)
    resumed = ef.Trainer.from_checkpoint(path, SmallMLP(), optimizer="sgd")
    resumed.fit(
        ef.data.ImageFolder(mnist + "/train", normalize=NORMALIZE),
        epochs=2,
        initial_epoch=1,
        batch_size=50,
        verbose=0,
    )
    assert int(resumed.state.step) == 2 * int(trainer.state.step)


def test_an_optimizer_that_differs_from_the_saved_one_names_both(normalized):
    _, path, _ = normalized
    with pytest.raises(ef.errors.CheckpointError) as e:
        ef.Trainer.from_checkpoint(path, SmallMLP(), optimizer="adam")
    message = str(e.value)
    assert "saved with the optimizer 'sgd'" in message and "this trainer's optimizer is 'adam'" in message
    assert "optimizer='sgd'" in message and "partial_restore" not in message and "\n" not in message
