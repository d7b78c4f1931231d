"""What a newcomer from Keras meets in the first hour: errors that say the fix, an aligned
``easyfit info``, and a README whose "Ten lines" has ten."""

from __future__ import annotations

import re

import numpy as np
import pytest

import easyfit as ef
from tests.helpers import ROOT
from tests.helpers.models import SmallMLP


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
