"""Every encoded record of a Caffe2 LMDB is checked on the host once, when the source is built,
before any pipeline of the source decodes one: DALI 2.4's CPU decoders crash the process on
some broken images, and an LMDB's records are read (and decoded) inside DALI
(docs/data-formats.md, "Bad data"). The check runs in child processes over ranges of the keys;
whatever the split, it names the first bad record in key order."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import optax
import pytest

import easyfit as ef
from easyfit.data.images import SAMPLED
from easyfit.data.sources.lmdb_walk import walk_lmdb
from tests.data.test_integrity import CORRUPTIONS
from tests.helpers.formats import encode, write_lmdb
from tests.helpers.models import SmallMLP

N = 200
MIDDLE = N // 2  # past the first SAMPLED records, which building the source reads
CRASHING = [
    "jpeg segment length past its end",
    "png bit depth 3",
    "bmp bit count 7",
    "webp VP8 start code",
]  # each crashed DALI 2.4's CPU decoder


@pytest.fixture(scope="module")
def digits(mnist_arrays):
    x, y = mnist_arrays["train"]
    return x[:N, :, :, 0], y[:N]


def _fresh_trainer() -> ef.Trainer:
    return ef.Trainer(SmallMLP(), optimizer=optax.sgd(0.1), seed=0)


def _broken_lmdb(path, digits, kind: str, at: int = MIDDLE) -> tuple[str, str]:
    """An LMDB of the digits with record ``at`` broken by ``CORRUPTIONS[kind]``; the message."""
    (_, save), corrupt, message = CORRUPTIONS[kind]
    images = [save(a) for a in digits[0]]
    images[at] = corrupt(images[at])
    return write_lmdb(path, images, digits[1]), message


@pytest.mark.parametrize("at", [0, SAMPLED, N - 1])
def test_a_broken_record_is_named_wherever_it_lies(tmp_path, digits, at):
    """Among the records building the source reads up front (0), just past them, and the last:
    the check reads every record, not only those."""
    db, message = _broken_lmdb(tmp_path / "db", digits, "jpeg segment length past its end", at)
    with pytest.raises(ef.errors.DataError, match=f"^{db}: record {at} .in key order.: {message}"):
        ef.data.Caffe2LMDB(db)


@pytest.mark.parametrize("kind", CRASHING)
def test_a_broken_record_is_named_by_fit_before_any_decode(tmp_path, digits, kind):
    db, message = _broken_lmdb(tmp_path / "db", digits, kind)
    trainer = _fresh_trainer()
    with pytest.raises(ef.errors.DataError, match=f"^{db}: record {MIDDLE} .in key order.: {message}"):
        trainer.fit(db, epochs=1, batch_size=N, verbose=0)
    assert trainer.state is None  # no batch was produced


@pytest.mark.parametrize("kind", CRASHING[:2])
def test_a_broken_record_is_named_by_evaluate_before_any_decode(tmp_path, digits, trainer, kind):
    db, message = _broken_lmdb(tmp_path / "db", digits, kind)
    with pytest.raises(ef.errors.DataError, match=f"^{db}: record {MIDDLE} .in key order.: {message}"):
        trainer.evaluate(db, batch_size=N)


def test_a_good_lmdb_trains_and_is_checked_once_when_built(tmp_path, digits, trainer):
    (_, save), corrupt, _ = CORRUPTIONS["png bit depth 3"]
    images = [save(a) for a in digits[0]]
    db = write_lmdb(tmp_path / "db", images, digits[1])
    source = ef.data.Caffe2LMDB(db)
    np.testing.assert_array_equal(source.known_labels(), digits[1])  # read with the check
    assert source.known_labels().dtype == np.int32
    history = trainer.fit(source, epochs=1, batch_size=50, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    # Once per source object: after the record is broken in place, only a new source sees it.
    write_lmdb(db, images[:MIDDLE] + [corrupt(images[MIDDLE])] + images[MIDDLE + 1 :], digits[1])
    source.check()
    with pytest.raises(ef.errors.DataError, match=f"^{db}: record {MIDDLE} "):
        ef.data.Caffe2LMDB(db).check()


def test_a_label_outside_the_outputs_is_named_with_its_record(tmp_path, digits, trainer):
    labels = digits[1].copy()
    labels[MIDDLE] = 10
    db = write_lmdb(tmp_path / "db", [encode(a) for a in digits[0]], labels)
    with pytest.raises(
        ef.errors.DataError, match=f"label 10 .at {db}: record {MIDDLE} .in key order.. is outside"
    ):
        trainer.fit(db, epochs=1, batch_size=N, verbose=0)


def test_raw_records_are_not_read_ahead(tmp_path, digits, trainer):
    db = write_lmdb(tmp_path / "db", list(digits[0][:, :, :, None]), digits[1])
    source = ef.data.Caffe2LMDB(db)
    source.check()
    assert source.known_labels() is None
    history = trainer.fit(source, epochs=1, batch_size=50, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


# ------------------------------------------------------------- a damaged database (issue 17)
_OPEN_AND_CHECK = """
import sys
import easyfit as ef
try:
    ef.data.Caffe2LMDB(sys.argv[1]).check()
except ef.errors.DataError as e:
    print(e)
    sys.exit(3)
print("read")
"""


def _damaged(path, digits, how: str) -> str:
    db = write_lmdb(path, [encode(a) for a in digits[0]], digits[1])
    data = os.path.join(db, "data.mdb")
    raw = bytearray(open(data, "rb").read())
    if how == "smashed page":
        raw[3 * 4096 : 3 * 4096 + 64] = b"\xff" * 64  # the header of a leaf page
    else:
        raw = raw[: len(raw) // 2]
    with open(data, "wb") as f:
        f.write(raw)
    return db


@pytest.mark.parametrize("how", ["smashed page", "truncated file"])
def test_a_damaged_database_raises_data_error_and_never_kills_the_process(tmp_path, digits, how):
    """DALI's reader died here with SIGSEGV (smashed page) or SIGBUS (file cut in half); the
    program runs in a subprocess so that a crash fails the test instead of killing pytest."""
    db = _damaged(tmp_path / "db", digits, how)
    run = subprocess.run(
        [sys.executable, "-c", _OPEN_AND_CHECK, db], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 3, (run.returncode, run.stdout, run.stderr[-2000:])
    expected = (
        r"record \d+ \(in key order\): damaged LMDB \(CorruptedError"
        if how == "smashed page"
        else r"data.mdb is truncated \(\d+ of \d+ bytes\)"
    )
    assert re.match(f"^{re.escape(db)}: {expected}", run.stdout), run.stdout


def test_an_unparsable_record_is_named(tmp_path, digits):
    import lmdb

    db = write_lmdb(tmp_path / "db", [encode(a) for a in digits[0]], digits[1])
    env = lmdb.open(db, map_size=1 << 30)
    with env.begin(write=True) as txn:
        txn.put(f"{MIDDLE:08d}".encode(), b"\xff\xff\xff not a protobuf")
    env.close()
    with pytest.raises(
        ef.errors.DataError, match=f"^{db}: record {MIDDLE} .in key order.: not a Caffe2 TensorProtos"
    ):
        ef.data.Caffe2LMDB(db)


# ------------------------------------------------------- the check split over child processes
def _walk_message(db: str, parts: int) -> str:
    with pytest.raises(ef.errors.DataError) as raised:
        walk_lmdb(db, parts)
    return str(raised.value)


def test_every_split_gives_the_labels_in_key_order(tmp_path, digits):
    db = write_lmdb(tmp_path / "db", [encode(a) for a in digits[0][:5]], digits[1][:5])
    for parts in (1, 2, 5, 7):  # 7: more children than records, two with nothing to read
        num, labels = walk_lmdb(db, parts)
        assert num == 5
        np.testing.assert_array_equal(labels, digits[1][:5])


@pytest.mark.parametrize(
    "bad",
    [[N - 1], [MIDDLE, N - 1], [N // 3 - 1, N // 3]],  # the last range; two ranges; a boundary
)
def test_every_split_names_the_first_bad_record_in_key_order(tmp_path, digits, bad):
    (_, save), corrupt, message = CORRUPTIONS["jpeg segment length past its end"]
    images = [save(a) for a in digits[0]]
    for k in bad:
        images[k] = corrupt(images[k])
    db = write_lmdb(tmp_path / "db", images, digits[1])
    expected = f"{db}: record {bad[0]} (in key order): "
    for parts in (1, 3):
        assert re.match(re.escape(expected) + message, _walk_message(db, parts)), parts


def test_every_split_names_the_same_damaged_record(tmp_path, digits):
    db = _damaged(tmp_path / "db", digits, "smashed page")
    one = _walk_message(db, 1)
    assert re.match(rf"^{re.escape(db)}: record \d+ \(in key order\): damaged LMDB \(CorruptedError", one)
    assert _walk_message(db, 4) == one


def test_the_children_apply_max_image_pixels_as_set_in_the_parent(tmp_path, digits, monkeypatch):
    db = write_lmdb(tmp_path / "db", [encode(a) for a in digits[0][:4]], digits[1][:4])
    monkeypatch.setattr(ef.data.validation.encoded, "MAX_IMAGE_PIXELS", 28 * 28 - 1)
    assert "record 0 (in key order): PNG of 28x28 pixels, more than MAX_IMAGE_PIXELS (783" in (
        _walk_message(db, 2)
    )
    monkeypatch.setattr(ef.data.validation.encoded, "MAX_IMAGE_PIXELS", None)
    assert walk_lmdb(db, 2)[0] == 4
