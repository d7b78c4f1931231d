"""Keras' ``image_dataset_from_directory``, as easyfit reads image folders (issue 48): images in
sub-folders of a class folder are read under their top class, ``predict`` reads every image of
a folder (Keras' ``labels=None``), ``class_names`` is an ordered subset. Each test names the
Keras test it stands for (``keras: utils/image_dataset_utils_test.py::<test>``) and checks what
reaches the model: every image is a flat 4x4 gray square whose value names it, the model's
output is that value, and the steps record the values and labels they see."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest
from flax import linen as nn

import easyfit as ef
from tests.helpers.formats import encode


def value(i: int) -> int:
    """The gray value of image ``i``."""
    return 8 * i + 4


def prepare_directory(root, num_classes: int = 2, count: int = 16, nested: bool = False) -> dict[int, int]:
    """Keras' ``_prepare_directory``: ``count`` images spread over ``class_<k>`` folders (with
    ``nested``, also over ``subfolder_1``, ``subfolder_2`` and ``subfolder_1/sub-subfolder``
    of each), image ``i`` of value :func:`value` ``(i)``. Returns each value's class."""
    paths = []
    for k in range(num_classes):
        top = f"class_{k}"
        deeper = [f"{top}/subfolder_1", f"{top}/subfolder_2", f"{top}/subfolder_1/sub-subfolder"]
        paths += [(k, p) for p in [top, *(deeper if nested else [])]]
    for _, path in paths:
        os.makedirs(os.path.join(root, path))
    classes = {}
    for i in range(count):
        k, path = paths[i % len(paths)]
        write(os.path.join(root, path, f"image_{i}.png"), value(i))
        classes[value(i)] = k
    return classes


def write(path, v: int) -> None:
    with open(path, "wb") as f:
        f.write(encode(np.full((4, 4, 1), v, np.uint8)))


class Probe(nn.Module):
    """Outputs two logits: the image's first pixel (scaled to [0, 1]), twice, plus a bias."""

    @nn.compact
    def __call__(self, x):
        pixel = x.reshape((x.shape[0], -1))[:, :1]
        return jax.numpy.concatenate([pixel, pixel], axis=1) + self.param("b", nn.initializers.zeros, (2,))


class Seen(ef.Trainer):
    """Records ``(image values, labels, image shape)`` of each step's valid rows."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[np.ndarray, np.ndarray, tuple]] = []

    def _record(self, x, y, mask):
        keep = np.asarray(mask).astype(bool)
        x = np.asarray(x)
        self.seen.append((x.reshape(len(x), -1)[keep, 0].astype(int), np.asarray(y)[keep], x.shape[1:]))

    def compute_loss(self, outputs, batch):
        jax.debug.callback(self._record, batch["x"], batch["y"], batch["mask"])
        return super().compute_loss(outputs, batch)

    def saw(self) -> tuple[list[int], list[int], set]:
        """Every value and label trained on (sorted by value), and the image shapes."""
        jax.effects_barrier()
        values = np.concatenate([v for v, _, _ in self.seen])
        labels = np.concatenate([y for _, y, _ in self.seen])
        order = np.argsort(values)
        shapes = {s for _, _, s in self.seen}
        self.seen.clear()
        return values[order].tolist(), labels[order].tolist(), shapes


@pytest.fixture(scope="module")
def trainer():
    """One trainer for the module: its steps compile once."""
    return Seen(Probe(), seed=0, steps_per_execution=1)


def predicted(trainer, x, **kwargs) -> list[int]:
    """The value of each image ``predict`` read, in its order (the probe's bias is ~0)."""
    out = trainer.predict(x, batch_size=5, **kwargs)
    return np.rint(out[:, 0] * 255).astype(int).tolist()


def test_nested_class_folders_are_read_whole_and_what_is_left_out_is_said_once(trainer, tmp_path, capsys):
    """keras: utils/image_dataset_utils_test.py::test_image_dataset_from_directory_follow_links
    (25 images in ``class_<k>/subfolder_*/sub-subfolder``: all 25 are read, each labelled by
    its top class folder). What the folder holds beside them (a loose image beside the class
    folders, a text file, a hidden file) is left out, and said in one line, once."""
    classes = prepare_directory(tmp_path, num_classes=2, count=25, nested=True)
    write(tmp_path / "loose.png", 250)
    (tmp_path / "class_0" / "subfolder_2" / "notes.txt").write_text("not an image")
    write(tmp_path / "class_1" / ".hidden.png", 251)
    trainer.fit(str(tmp_path), epochs=1, batch_size=8, verbose=1, cache=False)
    values, labels, shapes = trainer.saw()
    assert values == sorted(classes)  # each image once: none of the left-out ones
    assert labels == [classes[v] for v in values]
    assert shapes == {(4, 4, 1)}
    said = [line for line in capsys.readouterr().out.splitlines() if "left out" in line]
    assert said == [
        f"easyfit: left out of {tmp_path}: beside the class folders: 1 (e.g. {tmp_path}/loose.png); "
        f"not images: 1 (e.g. {tmp_path}/class_0/subfolder_2/notes.txt); "
        f"hidden: 1 (e.g. {tmp_path}/class_1/.hidden.png)"
    ]
    trainer.evaluate(str(tmp_path), batch_size=8, verbose=1)  # the same folder: said once
    assert "left out" not in capsys.readouterr().out
    trainer.seen.clear()


def test_predict_reads_every_image_of_a_folder_a_file_or_a_list(trainer, tmp_path):
    """keras: utils/image_dataset_utils_test.py::test_image_dataset_from_directory_no_labels
    (7 images in 2 class folders and 3 loose in the parent: ``labels=None`` reads all 10, in
    batches of 5). ``predict`` reads them in order: the loose images sorted by name, then each
    class folder's; a folder with no class folders, one image file and a list of paths too, which
    ``evaluate`` refuses (no labels)."""
    classes = prepare_directory(tmp_path / "data", num_classes=2, count=7)
    for i in range(3):
        write(tmp_path / "data" / f"extra_{i}.png", 200 + i)
    by_class = sorted(classes, key=lambda v: (classes[v], f"image_{(v - 4) // 8}.png"))
    assert predicted(trainer, str(tmp_path / "data")) == [200, 201, 202, *by_class]
    loose = tmp_path / "loose"
    loose.mkdir()
    for i in (2, 0, 1):
        write(loose / f"{i}.png", 220 + i)
    assert predicted(trainer, str(loose)) == [220, 221, 222]  # no class folders
    assert predicted(trainer, str(loose / "1.png")) == [221]
    assert predicted(trainer, [str(loose / "2.png"), loose / "0.png"]) == [222, 220]
    with pytest.raises(ValueError, match="^x: a list of image paths has no labels"):
        trainer.evaluate([str(loose / "2.png")])  # evaluate needs class folders
    with pytest.raises(ValueError, match=r"^x: ImageFiles\(.*\) has no labels"):
        trainer.evaluate(ef.data.ImageFiles(loose))


def test_class_names_reads_an_ordered_subset_and_refuses_a_name_with_no_folder(trainer, tmp_path):
    """keras: utils/image_dataset_utils_test.py::test_image_dataset_from_directory_errors (a
    name with no folder: "The `class_names` passed did not match the names of the
    subdirectories"); keras: utils/dataset_utils.py::index_directory (``class_names``: a
    subset of the folders, read in its order). ``["class_2", "class_0"]`` trains on those two
    folders only, labelled 0 and 1."""
    classes = prepare_directory(tmp_path, num_classes=3, count=9)
    with pytest.raises(
        ef.errors.DataError, match=f"^{tmp_path}/wrong_class: no such class folder.*did not match"
    ):
        ef.data.ImageFolder(tmp_path, class_names=["class_0", "wrong_class"])
    source = ef.data.ImageFolder(tmp_path, class_names=["class_2", "class_0"])
    trainer.fit(source, epochs=1, batch_size=8, verbose=0, cache=False)
    values, labels, _ = trainer.saw()
    assert values == sorted(v for v, k in classes.items() if k != 1)
    assert labels == [{2: 0, 0: 1}[classes[v]] for v in values]
    assert (
        source.left_out
        == f"left out of {tmp_path}: class folders not in class_names: 1 (e.g. {tmp_path}/class_1)"
    )
