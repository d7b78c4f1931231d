"""The test files are in their true formats: DALI's own readers read them back, and easyfit's
sources read exactly what those readers read."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

import easyfit as ef
from easyfit.data import Loader
from tests.helpers.formats import (
    MAGIC,
    encode,
    write_npy_folder,
    write_recordio,
    write_tfrecord,
    write_webdataset,
)


@pytest.fixture(scope="module")
def sample(mnist_arrays):
    x, y = mnist_arrays["train"]
    return x[:40], y[:40]


def _run(graph, batch_size):
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None)
    def pipeline():
        return graph()

    pipe = pipeline()
    pipe.build()
    outs = pipe.run()
    return [[np.asarray(o.at(i)) for i in range(batch_size)] for o in outs]


def _loaded(source):
    plan = ef.data.Plan(source.num_samples, source.num_samples, shuffle=False)
    loader = Loader(source, plan, ef.parallel.Placement.create())
    batch = next(loader)
    loader.close()
    return np.asarray(batch["x"]), np.asarray(batch["y"])


def test_recordio_with_split_records_reads_back_through_dali(tmp_path, sample):
    from nvidia.dali import fn, types

    x, y = sample
    pngs = [encode(a) for a in x]
    for i in range(0, len(x), 3):  # the magic number inside the data: records split in parts
        pngs[i] += b"\0" * (-len(pngs[i]) % 4) + struct.pack("<I", MAGIC) + b"tail"
    rec = write_recordio(tmp_path / "d.rec", pngs, y)
    raw = open(rec, "rb").read()
    assert struct.unpack_from("<I", raw, 4)[0] >> 29 == 1  # record 0 is written in parts

    def graph():
        jpegs, labels = fn.readers.mxnet(path=[rec], index_path=[str(tmp_path / "d.idx")])
        return fn.decoders.image(jpegs, output_type=types.GRAY), labels

    images, labels = _run(graph, len(x))
    np.testing.assert_array_equal(np.stack(images), x)
    np.testing.assert_array_equal(np.concatenate(labels), y)
    ours = ef.data.RecordIO(tmp_path)
    np.testing.assert_array_equal(ours.known_labels(), y)
    got_x, got_y = _loaded(ours)
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)
    os.remove(tmp_path / "d.idx")  # without its index, the records' headers are walked
    np.testing.assert_array_equal(_loaded(ef.data.RecordIO(rec))[0], x)


def test_tfrecord_and_its_dali_index_read_back_through_dali(tmp_path, sample):
    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import fn, types

    x, y = sample
    path = write_tfrecord(tmp_path / "d.tfrecord", [encode(a, "jpeg") for a in x], y)
    offsets = np.loadtxt(path + ".idx", dtype=np.int64)
    assert offsets.shape == (len(x), 2) and offsets[0, 0] == 0

    def graph():
        features = fn.readers.tfrecord(
            path=path,
            index_path=path + ".idx",
            features={
                "image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1),
            },
        )
        return (
            fn.decoders.image(features["image/encoded"], output_type=types.GRAY),
            features["image/class/label"],
        )

    images, labels = _run(graph, len(x))
    np.testing.assert_array_equal(np.concatenate(labels), y)
    got_x, got_y = _loaded(ef.data.TFRecord(tmp_path))
    np.testing.assert_array_equal(got_x, np.stack(images))  # the same JPEG decoder
    np.testing.assert_array_equal(got_y, y)
    assert np.abs(got_x.astype(int) - x).mean() < 8  # JPEG is lossy, but close


def test_webdataset_shards_read_back_through_dali(tmp_path, sample):
    from nvidia.dali import fn, types

    x, y = sample
    tar = write_webdataset(tmp_path / "s-0.tar", [encode(a, "webp") for a in x], y, ext="webp")

    def graph():
        images, labels = fn.readers.webdataset(paths=[tar], ext=["webp", "cls"])
        return fn.decoders.image(images, output_type=types.GRAY), labels

    images, labels = _run(graph, len(x))
    np.testing.assert_array_equal(np.stack(images), x)  # lossless WebP
    assert [int(bytes(b)) for b in labels] == y.tolist()
    assert ef.data.WebDataset(tmp_path).color_mode == "rgb"  # WebP has no grayscale mode
    got_x, got_y = _loaded(ef.data.WebDataset(tmp_path, color_mode="grayscale"))
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)


def test_numpy_folders_read_back_through_dalis_numpy_reader(tmp_path, sample):
    from nvidia.dali import fn

    x, y = sample
    root = write_npy_folder(tmp_path, x.astype(np.float32) / 7, y)
    source = ef.data.NumpyFolder(root)
    assert source.scale is None and source.dtype == np.float32  # "auto": no scaling of floats
    files = [os.path.relpath(f, root) for f in source.files]

    def graph():
        return fn.readers.numpy(file_root=root, files=files)

    (arrays,) = _run(graph, len(x))
    got_x, got_y = _loaded(source)
    np.testing.assert_array_equal(got_x, np.stack(arrays))
    order = [int(os.path.basename(f).split(".")[0]) for f in source.files]
    np.testing.assert_array_equal(got_x, x[order].astype(np.float32) / 7)
    np.testing.assert_array_equal(got_y, y[order])


def test_record_files_open_each_file_once_when_many_threads_read_at_once(tmp_path, sample):
    """DALI's threads feed records concurrently: each file gets one descriptor, not one per
    thread that found it missing (RecordFiles' descriptor table is locked)."""
    import threading

    x, y = sample
    for k in range(4):
        write_recordio(tmp_path / f"part{k}.rec", [encode(a) for a in x[k::4]], y[k::4])
    source = ef.data.RecordIO(tmp_path)
    source.close()

    def open_record_files() -> list[str]:  # this process's descriptors on the .rec files only
        # (the process's other descriptors come and go with other threads: not counted)
        fds = "/proc/self/fd"
        links = []
        for fd in os.listdir(fds):
            try:
                links.append(os.readlink(os.path.join(fds, fd)))
            except OSError:
                pass
        return sorted(link for link in links if link.startswith(str(tmp_path)))

    assert open_record_files() == []
    start = threading.Barrier(16)

    def read(t: int) -> None:
        start.wait()
        for i in range(t % 4, len(source), 4):
            source.read(i)

    threads = [threading.Thread(target=read, args=(t,)) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert open_record_files() == sorted(str(tmp_path / f"part{k}.rec") for k in range(4))
    source.close()
    assert open_record_files() == []
