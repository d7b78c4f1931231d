"""The one stream interface (easyfit.data.stream): every kind of stream implements it and follows
the plan it was opened with; a reader's position is serialised only when read, and a position
read after the stream moved on still resumes at the same chunk."""

from __future__ import annotations

import numpy as np
import pytest

import easyfit as ef
from easyfit.data.kept_streams import KeptStreams
from easyfit.data.loader import Loader, kind_of, open_stream, stream_plan, stream_request
from easyfit.data.stream import LoaderOptions, Position, Stream
from easyfit.parallel import Placement
from tests.helpers.formats import write_lmdb

N = 120


@pytest.fixture(scope="module")
def lmdb(tmp_path_factory, mnist_arrays) -> ef.data.Caffe2LMDB:
    x, y = mnist_arrays["train"]
    root = write_lmdb(tmp_path_factory.mktemp("lmdb"), list(x[:N]), list(y[:N]))
    return ef.data.Caffe2LMDB(root)


@pytest.fixture(scope="module")
def arrays(mnist_arrays) -> ef.data.Arrays:
    x, y = mnist_arrays["train"]
    return ef.data.Arrays(x[:N], y[:N])


def _host(chunk) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in chunk.items()}


@pytest.mark.parametrize("kind", ["arrays", "lmdb"])
@pytest.mark.parametrize("cached", [False, True])
def test_every_stream_implements_the_protocol_and_keeps_the_plan_it_opens_with(kind, cached, request):
    source = request.getfixturevalue(kind)
    placement = Placement.create()
    plan = ef.data.Plan(N, 32, seed=1, steps_per_execution=2)
    asked = stream_request(source, plan, placement, cache=cached, options=LoaderOptions(), training=True)
    assert asked.kind is kind_of(source) and asked.cached is cached and asked.start == 0
    assert asked.plan == stream_plan(source, plan, placement, cached)
    fill = asked.fill  # a reader's cache is filled by one read of its own, in the source's order
    assert (fill is not None) == (cached and kind == "lmdb")
    if fill is not None:
        assert not fill.cached and fill.start == 0 and fill.plan.shuffle is False
        assert fill.plan.steps_per_pass == 4 and fill.plan.layout is not None  # 120 records in 32s
    stream = open_stream(asked)
    try:
        assert isinstance(stream, Stream)
        assert stream.plan is asked.plan
        first = _host(stream.peek())
        assert stream.iteration == 0
        got = _host(next(stream))
        assert sorted(got) == sorted(first) and all(np.array_equal(got[k], first[k]) for k in got)
        assert dict(stream.position())["chunk"] == 1
    finally:
        stream.close()
    kept = KeptStreams(placement, {})
    with kept.lease(source, ef.data.Plan(N, 40, shuffle=False), "auto" if cached else False) as lent:
        assert isinstance(lent, Stream)
        for _ in range(lent.plan.chunks_per_epoch):
            next(lent)
    kept.close()


def test_a_reader_loader_follows_the_plan_made_for_it_up_front(lmdb):
    placement = Placement.create()
    plan = ef.data.Plan(N, 32, seed=0)
    asked = stream_request(lmdb, plan, placement, cache=False, options=LoaderOptions(), initial_epoch=1)
    assert asked.plan.steps_per_pass == 4 and asked.start == 4  # 120 records, batches of 32
    loader = Loader(asked)
    legacy = Loader(lmdb, plan, placement, start=4)  # the form before requests, kept
    try:
        assert loader.plan is asked.plan and legacy.plan == asked.plan
        assert loader.iteration == legacy.iteration == 4
        want, got = _host(next(loader)), _host(next(legacy))
        for key in want:  # the same chunk, decoded the same way: exactly equal
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    finally:
        loader.close()
        legacy.close()


def test_a_reader_position_is_read_when_used_and_resumes_at_its_chunk_even_when_read_late(lmdb):
    placement = Placement.create()
    plan = stream_plan(lmdb, ef.data.Plan(N, 16, seed=3), placement, cached=False)
    loader = Loader(lmdb, plan, placement, training=True)
    try:
        next(loader)
        late = loader.position()  # chunk 1, read only after the stream moved on
        assert isinstance(late, Position) and not late.resolved
        expected = [_host(next(loader)) for _ in range(2)]  # chunks 1 and 2
        now = loader.position()  # chunk 3, read while the stream stands there
        assert dict(late) == {"chunk": 1}  # no DALI checkpoint: the reader reads and drops
        at_three = dict(now)
        assert at_three["chunk"] == 3 and len(at_three["dali"]) == 1 and at_three["readers"] == 1
        expected.append(_host(next(loader)))  # chunk 3
    finally:
        loader.close()
    # the reader's order depends on its shards: a position of 2 (2 processes' backup, which
    # holds no DALI checkpoint) is refused rather than read on in another order
    with pytest.raises(ValueError, match="saved for 2 reader pipelines, but this placement has 1"):
        Loader(lmdb, plan, placement, training=True, position={"chunk": 3, "readers": 2})
    for position, chunks in ((dict(late), expected), (at_three, expected[2:])):
        resumed = Loader(lmdb, plan, placement, training=True, position=position)
        try:
            for want in chunks:
                got = _host(next(resumed))
                for key in want:  # decoded the same way: exactly equal
                    np.testing.assert_array_equal(got[key], want[key], err_msg=f"{position} {key}")
        finally:
            resumed.close()


def test_a_position_still_unread_when_the_loader_closes_is_read_before_the_pipelines_go(lmdb):
    placement = Placement.create()
    plan = stream_plan(lmdb, ef.data.Plan(N, 16, seed=3), placement, cached=False)
    loader = Loader(lmdb, plan, placement)
    next(loader)
    position = loader.position()
    loader.close()
    assert position.resolved
    assert dict(position)["chunk"] == 1 and len(dict(position)["dali"]) == 1
