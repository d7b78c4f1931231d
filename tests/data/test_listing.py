"""Listing an image folder and its path table (issue 30): the classes, files, labels and path
bytes at ImageNet-21k's 21,841 classes, and the folders listing must refuse."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import easyfit as ef
from easyfit.data.sources.folder import IMAGE_EXTENSIONS, folder_files, path_table, scan_classes
from tests.helpers import ROOT, run_python

CLASSES = 21_841  # ImageNet-21k


@pytest.fixture(scope="module")
def many_classes(tmp_path_factory):
    """``root/<class>/<file>``: one empty file per class, the classes created in an order that
    is not their sorted one, the extensions in several cases."""
    root = tmp_path_factory.mktemp("classes")
    rng = np.random.default_rng(0)
    names = [f"n{k:08d}" for k in rng.permutation(10 * CLASSES)[:CLASSES]]
    files = {}
    for k, name in enumerate(names):
        os.mkdir(root / name)
        file = f"{k}.{('jpg', 'JPEG', 'png')[k % 3]}"
        os.close(os.open(root / name / file, os.O_CREAT | os.O_WRONLY))
        files[name] = str(root / name / file)
    return str(root), files


def test_21841_classes_are_listed_in_sorted_order_each_file_labelled_by_its_class(many_classes):
    root, files = many_classes
    names, listed, labels = scan_classes(root, IMAGE_EXTENSIONS)
    assert names == sorted(files)
    assert listed == [files[name] for name in names]
    assert labels.dtype == np.int32
    np.testing.assert_array_equal(labels, np.arange(CLASSES))


def test_21841_given_class_names_label_each_file_by_its_position_among_them(many_classes):
    root, files = many_classes
    given = sorted(files, reverse=True) + ["extra"]  # another split may have more classes
    names, listed, labels = scan_classes(root, IMAGE_EXTENSIONS, class_names=given, allow_empty=True)
    assert names == given
    assert listed == [files[name] for name in given[:-1]]  # read in the order of the names
    np.testing.assert_array_equal(labels, np.arange(CLASSES))


def test_a_repeated_given_class_name_labels_by_its_first_place(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "0.png").touch()
    _, files, labels = scan_classes(str(tmp_path), IMAGE_EXTENSIONS, class_names=["b", "a", "b"])
    assert [os.path.relpath(f, tmp_path) for f in files] == ["b/0.png", "a/0.png"]  # each once
    assert labels.tolist() == [0, 1]


def test_folder_files_keeps_image_files_only_sorted_and_skips_folders(tmp_path):
    for name in ("b.PNG", "a.jpg", "c.txt", ".hidden.png"):
        (tmp_path / name).touch()
    (tmp_path / "d.jpg").mkdir()  # a folder named like an image
    os.symlink(tmp_path / "a.jpg", tmp_path / "e.jpeg")
    got = folder_files(str(tmp_path), IMAGE_EXTENSIONS)
    assert got == [str(tmp_path / n) for n in (".hidden.png", "a.jpg", "b.PNG", "e.jpeg")]


def test_a_broken_link_among_the_files_is_named(tmp_path):
    (tmp_path / "a.jpg").touch()
    os.symlink(tmp_path / "gone.jpg", tmp_path / "b.jpg")
    with pytest.raises(ef.errors.DataError, match=f"^{tmp_path}/b.jpg: cannot be followed"):
        folder_files(str(tmp_path), IMAGE_EXTENSIONS)


@pytest.mark.parametrize(
    "layout, says",
    [
        ({}, "no class folders"),
        ({"a": [], "b": []}, "no images in any class folder"),
        (
            {"a": ["0.png"], "b": [], "c": ["x.txt"]},
            "b: class folder with no images .and 1 more.; remove it, or pass allow_empty=True",
        ),
    ],
)
def test_bad_folders_are_refused_naming_what_is_missing(tmp_path, layout, says):
    for name, content in layout.items():
        (tmp_path / name).mkdir()
        for file in content:
            (tmp_path / name / file).touch()
    with pytest.raises(ef.errors.DataError, match=says):
        scan_classes(str(tmp_path), IMAGE_EXTENSIONS)


def test_a_class_folder_outside_another_splits_classes_is_named(tmp_path):
    """With allow_empty (the classes of another split), a folder of another class is refused;
    without, class_names is Keras' subset and the folder is left out (tests/keras/)."""
    for name in ("a", "z"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "0.png").touch()
    with pytest.raises(ef.errors.DataError, match=f"^{tmp_path}/z: not one of the classes .'a'."):
        scan_classes(str(tmp_path), IMAGE_EXTENSIONS, class_names=["a"], allow_empty=True)


def test_the_path_table_holds_each_paths_file_system_bytes_zero_padded():
    paths = ["a.png", "", "dir/ünï.jpg", "bad-\udcff.png", "x" * 300]
    table, lengths = path_table(paths)
    encoded = [os.fsencode(p) for p in paths]
    assert table.dtype == np.uint8 and lengths.dtype == np.int32
    assert table.shape == (len(paths), 300) and lengths.shape == (len(paths), 1)
    for row, length, want in zip(table, lengths[:, 0], encoded, strict=True):
        assert length == len(want)
        assert row[:length].tobytes() == want
        assert not row[length:].any()


def test_a_path_with_a_nul_character_is_refused_naming_it():
    with pytest.raises(ef.errors.DataError, match=r"^'b\\x00c.png': a path with a NUL character"):
        path_table(["a.png", "b\0c.png"])


@pytest.mark.slow  # runs the benchmark in a fresh interpreter
def test_the_listing_benchmark_writes_its_folder_and_times_the_listing(tmp_path):
    args = ("--files", "60", "--classes", "7", "--dir", str(tmp_path), "--repeat", "1")
    out = json.loads(run_python(str(ROOT / "benchmarks" / "listing.py"), *args).splitlines()[-1])
    assert (out["files"], out["classes"]) == (60, 7)
    names, files, labels = scan_classes(str(tmp_path / "60-7"), IMAGE_EXTENSIONS)
    assert len(names) == 7 and len(files) == 60 and np.bincount(labels).tolist() == [9, 9, 9, 9, 8, 8, 8]
