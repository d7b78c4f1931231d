"""The source contract: capabilities found by what a source has, never by its class; a Subset
with its source's capabilities, renumbered; the image settings as one value, given as the
same keyword arguments to every image source."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

import easyfit as ef
from easyfit.data.images import ImageSettings
from easyfit.data.sources import capabilities as caps
from easyfit.data.sources.base import IndexedSource, check_hint
from easyfit.data.split import held_out
from easyfit.persistence.fingerprint import data_fingerprint
from tests.helpers.formats import encode, write_tfrecord

#: every capability, by name
ALL = {name: getattr(caps, name) for name in caps.__all__ if name[0].isupper()}


def _has(source) -> set[str]:
    return {name for name, protocol in ALL.items() if isinstance(source, protocol)}


class _Columns(IndexedSource):
    """A format of the contract's required members only, holding its rows as ``x`` and ``y``."""

    scale = None

    def __init__(self, n: int):
        self.x = np.arange(n, dtype=np.float32)[:, None]
        self.y = np.arange(n, dtype=np.int32) % 2

    @property
    def num_samples(self) -> int:
        return len(self.x)

    @property
    def num_feeds(self) -> int:
        return 2

    def feed(self, indices):
        return [self.x[indices], self.y[indices]]

    def graph(self, *nodes, device, draws=None):
        return nodes


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("caps")
    for i in range(6):
        os.makedirs(root / f"c{i % 2}", exist_ok=True)
        ef.datasets.write_png(str(root / f"c{i % 2}" / f"{i}.png"), np.full((6, 8, 3), 40 * i, np.uint8))
    return str(root)


def test_a_subset_has_the_capabilities_of_its_source_renumbered(folder):
    arrays = ef.data.Arrays(np.zeros((10, 2)), np.arange(10) * 3)
    images = ef.data.ImageFolder(folder, image_size=(6, 8), color_mode="rgb")
    try:
        assert _has(arrays) == {"KnownLabels", "InMemory"}
        assert _has(images) == {
            "KnownLabels",
            "SampleChecks",
            "EncodedSamples",
            "FileBacked",
            "FolderListing",
        }
        part = ef.data.Subset(ef.data.Subset(arrays, [1, 3, 5, 7]), [0, 2])
        assert _has(part) == {"KnownLabels", "View"}
        assert part.known_labels().tolist() == [3, 15]
        assert isinstance(part, ef.data.Subset) and caps.base_of(part) is arrays
        # a subset says what its source says: no member forwarded by hand
        assert (part.num_feeds, part.outputs, part.label_dtype) == (2, ("x", "y"), np.dtype(np.int32))
        assert part.recipe() == arrays.recipe()
        shown = ef.data.Subset(images, [4, 1])
        assert _has(shown) == {"KnownLabels", "SampleChecks", "EncodedSamples", "View"}
        assert shown.locate(0) == images.files[4] and shown.encoded_image(1) == images.encoded_image(1)
        assert shown.sample_problem(0) is None and shown.known_labels().tolist() == [1, 0]
        assert "easyfit check" in check_hint(shown) and check_hint(part) == ""
    finally:
        images.close()


def test_a_format_of_the_required_members_alone_is_read_by_its_capabilities():
    columns = _Columns(9)
    assert _has(columns) == {"InMemory"}
    assert caps.known_labels(columns) is None
    columns.close()  # the contract's no-op
    # rows held in memory count as Keras counts arrays, whatever the class: 9 - floor(9 * 0.9)
    assert held_out(ef.data.Subset(columns, range(9)), 9, 0.1) == 1
    found = data_fingerprint(ef.data.Subset(columns, [0, 4, 8]))
    assert {"arrays", "subset"} <= set(found) and found["kind"] == "_Columns"
    assert found != data_fingerprint(ef.data.Subset(columns, [0, 4, 7]))


def test_image_settings_are_one_value_given_as_the_same_keyword_arguments(tmp_path):
    path = write_tfrecord(
        tmp_path / "t.tfrecord", [encode(np.full((6, 8, 3), 9 * i, np.uint8)) for i in range(4)], [0, 1, 0, 1]
    )
    given = dict(image_size=(4, 4), color_mode="rgb", decoder="cpu", crop_to_aspect_ratio=True)
    records = ef.data.TFRecord(path, **given)
    try:
        assert (records.image_shape, records.aspect) == ((4, 4, 3), "crop")
        assert records.settings()["crop_to_aspect_ratio"] is True  # another split is read alike
        assert ImageSettings(**given).image_size == (4, 4)
        with pytest.raises(TypeError, match="TFRecord.. got an unexpected keyword argument 'image_szie'"):
            ef.data.TFRecord(path, image_szie=(4, 4))
        with pytest.raises(TypeError, match="ImageFiles.. got an unexpected keyword argument 'augment'"):
            ef.data.ImageFiles([path], augment=ef.data.Augment(flip=True))
        with pytest.raises(ValueError, match="decoder='gpu'"):
            ef.data.TFRecord(path, decoder="gpu")
        with pytest.raises(dataclasses.FrozenInstanceError):
            ImageSettings(**given).image_size = (2, 2)  # type: ignore[misc]
    finally:
        records.close()
