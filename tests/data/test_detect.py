"""Detection is a registry: a format registered from its own module (here, this test module)
is recognised by ``detect`` as the built-in ones are, from one listing of a folder."""

from __future__ import annotations

import pytest

from easyfit.data.detect import detect
from easyfit.data.sources import Source
from easyfit.data.sources.registry import FILES, Format, holding, register
from easyfit.errors import DataError


class ToyShards(Source):
    """A toy format: ``.toy`` shards. Never built here: detection only names the class."""


register(Format("toy-shards", ToyShards, holding(".toy"), suffixes=(".toy",), priority=FILES))


def test_a_format_registered_by_its_module_is_detected(tmp_path):
    (tmp_path / "toy").mkdir()
    for name in ("a.toy", "b.TOY", "notes.txt"):
        (tmp_path / "toy" / name).write_bytes(b"\0")
    assert detect(tmp_path / "toy") is ToyShards  # a folder of its files
    assert detect(tmp_path / "toy" / "a.toy") is ToyShards  # one of its files
    (tmp_path / "toy" / "c.tar").write_bytes(b"\0")  # and WebDataset's, of the same priority
    with pytest.raises(DataError, match=r"toy: holds files of several formats \(.*ToyShards"):
        detect(tmp_path / "toy")
