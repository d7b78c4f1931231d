"""Bad data raises DataError naming the file or argument, before or at the first batch, and
reading never changes the data directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import easyfit as ef
from easyfit.data.images import sample_positions
from tests.helpers import PROGRAMS
from tests.helpers.formats import encode, write_lmdb, write_recordio, write_tfrecord, write_webdataset
from tests.helpers.models import SmallMLP

N = 100
LATE = next(i for i in range(N) if i not in set(sample_positions(N)))  # not read up front


@pytest.fixture(scope="module")
def xy(mnist_arrays):
    x, y = mnist_arrays["train"]
    return x[:N], y[:N]


def _folder(root, xy) -> list[str]:
    """``root/<digit>/<n>.png`` of the N images; the paths in ImageFolder order."""
    for i, (image, label) in enumerate(zip(*xy, strict=True)):
        os.makedirs(os.path.join(root, str(label)), exist_ok=True)
        ef.datasets.write_png(os.path.join(root, str(label), f"{i:03d}.png"), image)
    return ef.data.ImageFolder(root).files


def _fit(trainer, data, **kw):
    return trainer.fit(data, epochs=1, batch_size=N, verbose=0, **kw)


BROKEN = {
    "corrupt": lambda raw: bytes(b ^ 0x5A for b in raw),
    "truncated": lambda raw: raw[: len(raw) // 2],
    "not an image": lambda raw: b"these are notes, not pixels\n",
    "empty": lambda raw: b"",
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_broken_image_is_named_at_the_first_batch(tmp_path, xy, trainer, kind):
    files = _folder(tmp_path, xy)
    with open(files[LATE], "rb") as f:
        raw = f.read()
    with open(files[LATE], "wb") as f:
        f.write(BROKEN[kind](raw))
    hint = re.escape(f"(to list every bad file at once: easyfit check {tmp_path})")
    with pytest.raises(ef.errors.DataError, match=f"^{files[LATE]}: .*{hint}$"):
        _fit(trainer, str(tmp_path))


@pytest.mark.parametrize("kind", ["not an image", "empty"])
def test_a_broken_image_read_up_front_is_named_at_once(tmp_path, xy, kind):
    files = _folder(tmp_path, xy)
    with open(files[0], "wb") as f:
        f.write(BROKEN[kind](b""))
    with pytest.raises(ef.errors.DataError, match=f"^{files[0]}: (empty file|not an image)"):
        ef.data.ImageFolder(tmp_path)


def test_a_later_image_of_another_size_is_named(tmp_path, xy, trainer):
    """Each image decodes alone, so the bad-sample search found nothing: the batch of mixed
    shapes, or a batch of another shape than those before it, named no file."""
    files = _folder(tmp_path, xy)
    ef.datasets.write_png(files[LATE], np.zeros((32, 32, 1), np.uint8))  # not sampled at start-up
    said = (
        r"samples of x differ in shape \(\(28, 28, 1\) and \(32, 32, 1\)\): "
        f"{files[LATE]} is decoded to shape \\(32, 32, 1\\), not \\(28, 28, 1\\)"
    )
    with pytest.raises(ef.errors.DataError, match=said):  # in one batch with 28x28 images
        _fit(trainer, str(tmp_path))
    source = ef.data.ImageFolder(tmp_path)
    loader = ef.data.Loader(source, ef.data.Plan(N, 1, shuffle=False), ef.parallel.Placement.create())
    try:  # in a batch of its own: the model would be traced anew for it, and fail in flax
        with pytest.raises(ef.errors.DataError, match=said):
            for _ in range(LATE + 1):
                next(loader)
    finally:
        loader.close()


@pytest.mark.slow
def test_an_unreadable_file_is_named(tmp_path, xy):
    base = tempfile.mkdtemp(dir="/tmp")  # reachable by the unprivileged user the program becomes
    try:
        os.chmod(base, 0o755)
        late, early = os.path.join(base, "late"), os.path.join(base, "early")
        bad = _folder(late, xy)[LATE]
        bad_early = _folder(early, (xy[0][:3], xy[1][:3]))[1]
        os.chmod(bad, 0)
        os.chmod(bad_early, 0)
        proc = subprocess.run(
            [sys.executable, str(PROGRAMS / "unreadable.py"), late, early, bad],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        errors = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(base)
    assert errors["first_batch"].startswith(f"{bad}: cannot be read (Permission denied)")
    assert errors["construction"].startswith(f"{bad_early}: cannot be read (Permission denied)")


def test_arrays_of_different_lengths(trainer, xy):
    x, y = xy
    with pytest.raises(ef.errors.DataError, match=f"x has {N} samples but y has {N - 1}"):
        trainer.fit(x, y[:-1], verbose=0)
    with pytest.raises(ef.errors.DataError, match="x has"):
        trainer.fit(x, y, validation_data=(x, y[:5]), verbose=0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_in_arrays(trainer, xy, bad):
    x = xy[0].astype(np.float32)
    x[7, 3, 3, 0] = bad
    with pytest.raises(ef.errors.DataError, match="x holds NaN or inf .first at sample 7"):
        trainer.fit(x, xy[1], verbose=0)
    y = xy[1].astype(np.float32)
    y[9] = bad
    with pytest.raises(ef.errors.DataError, match="y holds NaN or inf .first at sample 9"):
        trainer.evaluate(xy[0], y)


def test_float_labels_with_a_sparse_loss(xy):
    trainer = ef.Trainer(SmallMLP(), loss="sparse_categorical_crossentropy")
    with pytest.raises(ef.errors.DataError, match="^y: float32 labels given to loss="):
        trainer.fit(xy[0], xy[1].astype(np.float32), verbose=0)


def test_labels_outside_the_models_outputs(tmp_path, trainer, xy):
    x, y = xy
    y = y.copy()
    y[42] = 10
    with pytest.raises(
        ef.errors.DataError,
        match=r"^y: label 10 \(at x\[42\]\) is outside the "
        "model's 10 outputs",
    ):
        _fit(trainer, x, y=y)
    with pytest.raises(ef.errors.DataError, match=r"^y: label -1"):
        trainer.evaluate(x, np.where(y == 10, -1, y))
    files = _folder(tmp_path / "eleven", xy)
    os.makedirs(tmp_path / "eleven" / "99")  # an eleventh class: label 10
    shutil.copy(files[0], tmp_path / "eleven" / "99" / "extra.png")
    with pytest.raises(ef.errors.DataError, match=f"label 10 .at {tmp_path}/eleven/99/extra.png"):
        trainer.evaluate(str(tmp_path / "eleven"))
    write_tfrecord(tmp_path / "t.tfrecord", [encode(a) for a in x[:20]], [3] * 19 + [12])
    with pytest.raises(
        ef.errors.DataError, match=f"^{tmp_path}/t.tfrecord: record 19 .*: label 12 is outside"
    ):
        trainer.evaluate(str(tmp_path / "t.tfrecord"), batch_size=20)


def test_broken_records_are_named(tmp_path, xy):
    x, y = xy
    pngs = [encode(a) for a in x[:20]]
    rec = (
        write_recordio(tmp_path / "r" / "d.rec", pngs, y[:20])
        if os.makedirs(tmp_path / "r") is None
        else None
    )
    offsets = [int(line.split()[1]) for line in open(tmp_path / "r" / "d.idx")]
    with open(rec, "r+b") as f:
        f.seek(offsets[5])
        f.write(b"\0\0\0\0")
    with pytest.raises(
        ef.errors.DataError, match=f"^{rec}: not a RecordIO record at byte offset {offsets[5]}"
    ):
        ef.data.RecordIO(rec)
    tf = write_tfrecord(tmp_path / "t.tfrecord", pngs, y[:20], index=False)
    with open(tf, "r+b") as f:
        f.truncate(os.path.getsize(tf) - 3)
    with pytest.raises(ef.errors.DataError, match=f"^{tf}: truncated record at byte offset"):
        ef.data.TFRecord(tf)
    tar = write_webdataset(tmp_path / "w.tar", pngs, y[:20])
    broken = write_webdataset(tmp_path / "w2.tar", pngs[:19] + [pngs[19][:60]], y[:20])
    with pytest.raises(ef.errors.DataError, match=f"^{broken}: 000019: truncated PNG"):
        _load_all(ef.data.WebDataset(broken))
    assert len(ef.data.WebDataset(tar)) == 20


def test_a_broken_lmdb_record_is_named(tmp_path, xy, trainer):
    pngs = [encode(a) for a in xy[0]]
    pngs[-1] = b"\xff\xd8 not a JPEG"  # past the records probed up front
    db = write_lmdb(tmp_path / "db", pngs, xy[1])
    # Every record is checked on the host before a pipeline decodes any (test_lmdb_integrity.py).
    with pytest.raises(ef.errors.DataError, match=f"^{db}: record {N - 1} .in key order.: not an image"):
        trainer.evaluate(db, batch_size=N)


def _load_all(source):
    from easyfit.data import Loader

    plan = ef.data.Plan(len(source), len(source), shuffle=False)
    loader = Loader(source, plan, ef.parallel.Placement.create())
    try:
        return next(loader)
    finally:
        loader.close()


def _snapshot(root):
    seen = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(folder, name))
            seen[os.path.join(folder, name)] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
    return seen


def test_reading_never_changes_the_data_directories(format_roots, mnist_dir, trainer):
    roots = [*format_roots.values(), mnist_dir]
    before = [_snapshot(r) for r in roots]
    for root in roots:
        trainer.fit(root, epochs=1, batch_size=100, verbose=0)
        trainer.evaluate(os.path.join(root, "val"), batch_size=100)
        trainer.predict(os.path.join(root, "val"), batch_size=100)
    assert [_snapshot(r) for r in roots] == before
