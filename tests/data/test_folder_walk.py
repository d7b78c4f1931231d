"""Image folders walked as torchvision's ``DatasetFolder`` walks them (issue 48): sub-folders
at any depth, links to folders followed (``follow_links``), a link loop named, torchvision's
``is_valid_file`` and ``allow_empty``; what is left out said; the data fingerprint of a backup
covers the files listed. Tests that name a torchvision test stand for
``pytorch/vision test/test_datasets.py::<case>::<test>``, and check the samples and labels
the loader delivers: every image is a flat 4x4 gray square whose value names it."""

from __future__ import annotations

import os

import numpy as np
import pytest

import easyfit as ef
from easyfit.persistence.fingerprint import data_fingerprint, fingerprint_changes
from tests.helpers.formats import encode
from tests.helpers.stream import loader_batches

LISTED_ONLY = {"image_size": (4, 4), "color_mode": "grayscale"}  # no image is read to list


def write(path, v: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(encode(np.full((4, 4, 1), v, np.uint8)))


def delivered(source) -> list[tuple[int, int]]:
    """``(value, label)`` of every sample, in the source's order, as the loader delivers them."""
    (batch,) = loader_batches(source, 1, batch_size=len(source), shuffle=False)
    keep = batch["mask"].astype(bool)
    values = batch["x"].reshape(len(keep), -1)[keep, 0].astype(int)
    return list(zip(values.tolist(), batch["y"][keep].tolist(), strict=True))


def test_is_valid_file_chooses_the_files_instead_of_the_extensions_and_links_are_followed(tmp_path):
    """torchvision: DatasetFolderTestCase::test_is_valid_file (``is_valid_file`` on the path,
    in place of the extensions). A link to a folder outside is followed, as torchvision's
    ``os.walk(followlinks=True)``, and with ``follow_links=False`` (Keras' argument) left out
    and said."""
    write(tmp_path / "data/a/0.png", 10)
    write(tmp_path / "data/a/deep/1.dat", 11)  # an image by the filter, not by its name
    write(tmp_path / "data/a/2.jpg", 12)  # an image by its name, refused by the filter
    write(tmp_path / "data/b/3.png", 13)
    write(tmp_path / "elsewhere/4.png", 14)
    os.symlink(tmp_path / "elsewhere", tmp_path / "data/b/linked")
    keep = lambda path: path.endswith((".png", ".dat"))  # noqa: E731
    source = ef.data.ImageFolder(tmp_path / "data", is_valid_file=keep)
    assert delivered(source) == [(10, 0), (11, 0), (13, 1), (14, 1)]
    assert source.left_out == (
        f"left out of {tmp_path}/data: refused by is_valid_file: 1 (e.g. {tmp_path}/data/a/2.jpg)"
    )
    unlinked = ef.data.ImageFolder(tmp_path / "data", follow_links=False, **LISTED_ONLY)
    assert [os.path.relpath(f, tmp_path) for f in unlinked.files] == [
        "data/a/0.png",
        "data/a/2.jpg",
        "data/b/3.png",
    ]
    assert unlinked.left_out == (
        f"left out of {tmp_path}/data: not images: 1 (e.g. {tmp_path}/data/a/deep/1.dat); "
        f"links to folders (follow_links=False): 1 (e.g. {tmp_path}/data/b/linked)"
    )


def test_allow_empty_keeps_an_empty_class_and_a_split_may_lack_a_class(tmp_path):
    """torchvision: DatasetFolderTestCase::test_allow_empty (an empty class folder is a class
    with ``allow_empty=True``, refused without). With ``class_names`` (a validation folder
    read with the training folder's classes) a class may have no folder at all."""
    write(tmp_path / "train/a/0.png", 20)
    (tmp_path / "train/b_empty").mkdir()
    write(tmp_path / "train/c/1.png", 21)
    with pytest.raises(ef.errors.DataError, match=f"^{tmp_path}/train/b_empty: class folder with no images"):
        ef.data.ImageFolder(tmp_path / "train")
    train = ef.data.ImageFolder(tmp_path / "train", allow_empty=True)
    assert train.class_names == ["a", "b_empty", "c"]
    assert delivered(train) == [(20, 0), (21, 2)]
    write(tmp_path / "val/c/2.png", 22)
    with pytest.raises(
        ef.errors.DataError, match=f"^{tmp_path}/val/a: no such class folder.*allow_empty=True"
    ):
        ef.data.ImageFolder(tmp_path / "val", class_names=train.class_names)
    val = ef.data.ImageFolder(tmp_path / "val", class_names=train.class_names, allow_empty=True)
    assert delivered(val) == [(22, 2)]


@pytest.mark.parametrize("links", [{"a/deep/up": "a"}, {"a/to_b": "b", "b/to_a": "a"}])
def test_a_link_loop_is_named_not_followed_forever(tmp_path, links):
    """No peer test: torchvision's and Keras' ``os.walk(followlinks=True)`` follow a loop until
    the path is too long. A link back to a folder it is in (one link, or two that point at
    each other's folder) raises DataError naming it."""
    write(tmp_path / "a/deep/0.png", 1)
    write(tmp_path / "b/1.png", 2)
    for link, target in links.items():
        os.symlink(tmp_path / target, tmp_path / link)
    with pytest.raises(ef.errors.DataError, match=f"^{tmp_path}/a/.*: a symbolic link to .*a loop"):
        ef.data.ImageFolder(tmp_path, **LISTED_ONLY)
    assert len(ef.data.ImageFolder(tmp_path, follow_links=False, **LISTED_ONLY).files) == 2


def test_the_data_fingerprint_tells_the_nested_listing_from_the_top_level_one(tmp_path):
    """A backup taken when only the class folders' own images were read is refused on resume
    (``fingerprint_changes`` is what ``ResumePoint.check_data`` names): the fingerprint holds
    the files listed, also when their number is the same."""
    for path in ("a/0.png", "a/sub/1.png", "b/2.png", "b/sub/3.png", "b/4.png"):
        write(tmp_path / path, 0)
    now = data_fingerprint(ef.data.ImageFolder(tmp_path, **LISTED_ONLY))
    top = lambda path: os.path.dirname(os.path.dirname(path)) == str(tmp_path)  # noqa: E731
    before = data_fingerprint(ef.data.ImageFolder(tmp_path, is_valid_file=top, **LISTED_ONLY))
    assert (
        fingerprint_changes(before, now)
        == "the number of samples: 3 -> 5; the files (their names or sizes) changed"
    )
    same_count = lambda path: not path.endswith("4.png")  # noqa: E731
    other = data_fingerprint(ef.data.ImageFolder(tmp_path, is_valid_file=same_count, **LISTED_ONLY))
    no_sub = lambda path: not path.endswith("3.png")  # noqa: E731
    assert fingerprint_changes(
        other, data_fingerprint(ef.data.ImageFolder(tmp_path, is_valid_file=no_sub, **LISTED_ONLY))
    ) == ("the files (their names or sizes) changed")
