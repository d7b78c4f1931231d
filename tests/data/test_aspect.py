"""Images of another aspect ratio than ``image_size``: stretched (default), Keras'
``crop_to_aspect_ratio`` and ``pad_to_aspect_ratio``, and ``eval_crop`` with a non-square
``image_size``; checked on the pixels a batch delivers."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import easyfit as ef
from easyfit.data.recipe import ImageRecipe
from tests.helpers.stream import loader_batches

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """One 20x40 PNG: red, green and blue columns (10, 20 and 10 wide)."""
    root = tmp_path_factory.mktemp("aspect")
    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, :10], pixels[:, 10:30], pixels[:, 30:] = RED, GREEN, BLUE
    (root / "a").mkdir()
    Image.fromarray(pixels).save(root / "a" / "wide.png")
    return str(root)


def _pixels(source) -> np.ndarray:
    return loader_batches(source, 1, batch_size=1, shuffle=False)[0]["x"][0].astype(int)


def _near(pixel, color) -> bool:
    return bool(np.abs(np.asarray(pixel) - color).max() <= 40)


def test_stretch_crop_and_pad_as_keras(wide):
    """keras: image_dataset_utils_test.py::test_image_dataset_from_directory_crop_to_aspect_ratio
    and ::test_image_dataset_from_directory_pad_to_aspect_ratio (the shape is image_size; the
    crop keeps the center, the pad keeps all of the image between black bands)."""
    stretched = _pixels(ef.data.ImageFolder(wide, image_size=(10, 10)))
    assert stretched.shape == (10, 10, 3)
    assert _near(stretched[5, 0], RED) and _near(stretched[5, 9], BLUE)
    cropped = _pixels(ef.data.ImageFolder(wide, image_size=(10, 10), crop_to_aspect_ratio=True))
    assert cropped.shape == (10, 10, 3)
    assert all(_near(cropped[r, c], GREEN) for r in (0, 5, 9) for c in (0, 5, 9))
    padded = _pixels(ef.data.ImageFolder(wide, image_size=(10, 10), pad_to_aspect_ratio=True))
    assert padded.shape == (10, 10, 3)
    assert (padded[0] == 0).all() and (padded[9] == 0).all()  # the bands above and below
    assert _near(padded[5, 0], RED) and _near(padded[5, 5], GREEN) and _near(padded[5, 9], BLUE)


def test_eval_crop_of_a_non_square_size_keeps_the_whole_image_at_one(wide):
    """``eval_crop=1.0`` with ``image_size=(10, 20)`` of a 20x40 image: the whole image, not its
    middle half (the shorter side was resized to the longer target side)."""
    source = ef.data.ImageFolder(wide, image_size=(10, 20), eval_crop=1.0)
    x = _pixels(source)
    assert x.shape == (10, 20, 3)
    assert _near(x[5, 0], RED) and _near(x[5, 10], GREEN) and _near(x[5, 19], BLUE)
    recipe = source.image_recipe().to_json()
    assert recipe["cover"] == [10, 20] and recipe["resize_shorter"] is None
    assert "covers 10x20" in source.image_recipe().steps()


def test_the_recipe_carries_the_aspect_and_old_recipes_stretch(wide):
    source = ef.data.ImageFolder(wide, image_size=(10, 10), pad_to_aspect_ratio=True)
    saved = source.image_recipe().to_json()
    assert ImageRecipe.from_json(saved) == source.image_recipe()
    del saved["aspect"]  # a recipe written before the option
    assert ImageRecipe.from_json(saved).aspect == "stretch"
    rebuilt = ef.data.ImageFolder.from_recipe(wide, source.recipe())
    assert rebuilt.aspect == "pad"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"crop_to_aspect_ratio": True}, "needs image_size"),
        ({"image_size": (8, 8), "crop_to_aspect_ratio": True, "pad_to_aspect_ratio": True}, "not both"),
        ({"image_size": (8, 8), "pad_to_aspect_ratio": True, "eval_crop": 0.9}, "no center to crop"),
        (
            {
                "image_size": (8, 8),
                "crop_to_aspect_ratio": True,
                "augment": ef.data.Augment(random_resized_crop=(0.5, 1)),
            },
            "random crop's window decides",
        ),
    ],
)
def test_combinations_that_cannot_hold_are_refused(wide, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ef.data.ImageFolder(wide, **kwargs)


def test_rgba_is_refused_saying_what_to_do_instead(wide):
    """keras: image_dataset_utils_test.py::test_image_dataset_from_directory_standalone (its
    color_mode="rgba" case): refused here, naming the alternatives (docs/keras.md)."""
    with pytest.raises(ValueError, match=r"color_mode='rgba'.*NumpyFolder"):
        ef.data.ImageFolder(wide, color_mode="rgba")
