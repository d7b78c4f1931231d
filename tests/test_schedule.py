"""The order the tests are handed to xdist's workers (tests/helpers/schedule.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tests.helpers import ROOT
from tests.helpers.schedule import LONG, order


@dataclass
class Item:
    nodeid: str


def test_long_modules_open_each_workers_share_and_the_rest_keep_their_order():
    names = [
        "a.py::t1",
        "a.py::t2",
        "b.py::t1",
        "b.py::long",
        "c.py::t1",
        "d.py::long",
        "e.py::t1",
        "e.py::t2",
    ]
    long = {"b.py::long": 100, "d.py::long": 60, "e.py::t2": 50}
    items = [Item(n) for n in names]
    module_fixture = {"b.py::t1", "b.py::long"}.__contains__  # b.py's two share one

    def ids(*args) -> list[str]:
        return [i.nodeid for i in order(items, *args, pinned=lambda i: module_fixture(i.nodeid))]

    got = ids(2, long)
    assert sorted(got) == sorted(names)  # every test once
    # two shares of four (worksteal's first deal): each opens with its long tests, balanced (b.py's
    # 100 against 60 + 50), b.py's long test first beside the test sharing its module's fixture;
    # the short tests fill in, in their order
    assert got[:4] == ["b.py::long", "b.py::t1", "a.py::t1", "a.py::t2"]
    assert got[4:] == ["d.py::long", "e.py::t2", "c.py::t1", "e.py::t1"]
    assert ids(1, long)[:4] == ["b.py::long", "b.py::t1", "d.py::long", "e.py::t2"]
    assert ids(2, {}) == names  # nothing known: the order of collection


def test_the_known_long_tests_exist():
    """Each name of the table is a test of its file (a renamed one would be taken as short)."""
    missing = []
    for nodeid in LONG:
        path, name = nodeid.split("::", 1)
        name = name.split("[", 1)[0].rsplit(".", 1)[-1]  # a test's function, a doctest's object
        text = (ROOT / path).read_text() if (ROOT / path).exists() else ""
        if not re.search(rf"^\s*(?:def|class) {re.escape(name)}\b", text, re.M):
            missing.append(nodeid)
    assert not missing, missing
