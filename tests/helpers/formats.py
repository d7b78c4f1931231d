"""Writers of the reference data formats, for the tests (and benchmarks/make_data.py, which writes
its Caffe2 LMDBs with :func:`write_lmdb`): each writes the true on-disk format.

* Caffe2 LMDB: an LMDB (the ``lmdb`` package) of serialized Caffe2 ``TensorProtos`` (the
  message definitions of caffe2.proto): an encoded image (``STRING``) and an ``INT32`` label.
* MXNet RecordIO: dmlc's record framing (magic, flag+length word, 4-byte alignment, records
  that contain the magic split in parts) around MXNet's ``IRHeader``; ``.idx`` as im2rec writes.
* TFRecord: length, masked CRC-32C of the length, a ``tf.train.Example``, masked CRC-32C of
  the data (``google-crc32c``); the index made by DALI's own ``tfrecord2idx`` script.
* WebDataset: tar shards of ``<key>.<ext>`` members (``png``/``jpg`` image, ``cls`` label).
* NumPy: ``root/<class>/<n>.npy`` written by ``np.save``.
* Parquet: Hugging Face's layout, ``root/data/<split>-0000k-of-0000n.parquet`` written by
  pyarrow, the images as Hugging Face's ``Image`` struct (``{"bytes", "path"}``), the labels a
  ``ClassLabel`` (int64, with its names in the schema's ``huggingface`` metadata).
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = 0xCED7230A


def encode(image: np.ndarray, fmt: str = "png", **options) -> bytes:
    """An image encoded by Pillow (``png``, ``jpeg``, ``bmp``, ``webp``); ``options`` go to
    Pillow's ``save`` (``quality=95`` for a JPEG)."""
    from PIL import Image

    image = np.asarray(image, np.uint8)
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[..., 0]
    buf = io.BytesIO()
    lossless = {"lossless": True} if fmt == "webp" else {}
    Image.fromarray(image).save(buf, format=fmt.upper(), **{**lossless, **options})
    return buf.getvalue()


# ------------------------------------------------------------------------------- Caffe2 LMDB
def caffe2_messages() -> dict:
    from easyfit.data.protos import caffe2_messages as messages

    return messages()


STRING, INT32, BYTE, FLOAT = 4, 2, 3, 1


def write_lmdb(path: str | os.PathLike, images: Sequence[bytes | np.ndarray], labels: Sequence[int]) -> str:
    """Caffe2 LMDB: ``TensorProtos`` of an encoded image (or raw HWC uint8 array) and a label."""
    import lmdb

    m = caffe2_messages()
    os.makedirs(path, exist_ok=True)
    env = lmdb.open(os.fspath(path), map_size=1 << 30)
    with env.begin(write=True) as txn:
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            if isinstance(image, bytes):
                img = m["TensorProto"](data_type=STRING, string_data=[image])
            else:
                img = m["TensorProto"](
                    data_type=BYTE, dims=list(image.shape), byte_data=np.ascontiguousarray(image).tobytes()
                )
            lab = m["TensorProto"](data_type=INT32, int32_data=[int(label)])
            txn.put(f"{i:08d}".encode(), m["TensorProtos"](protos=[img, lab]).SerializeToString())
    env.close()
    return os.fspath(path)


# ----------------------------------------------------------------------------- MXNet RecordIO
def _frame(payload: bytes) -> bytes:
    """dmlc RecordIOWriter::WriteRecord: split at every aligned magic, pad parts to 4 bytes."""
    words = len(payload) // 4
    cuts = [i * 4 for i in range(words) if struct.unpack_from("<I", payload, i * 4)[0] == MAGIC]
    parts, start = [], 0
    for c in cuts:
        parts.append(payload[start:c])
        start = c + 4
    parts.append(payload[start:])
    out = b""
    for k, part in enumerate(parts):
        flag = 0 if len(parts) == 1 else (1 if k == 0 else (3 if k == len(parts) - 1 else 2))
        out += struct.pack("<II", MAGIC, (flag << 29) | len(part)) + part
        out += b"\0" * (-len(part) % 4)
    return out


def write_recordio(
    rec: str | os.PathLike,
    images: Sequence[bytes],
    labels: Sequence[float],
    ids: Sequence[int] | None = None,
    index: bool = True,
) -> str:
    """``.rec`` of IRHeader(flag=0, label, id, id2) + image records, and im2rec's ``.idx``."""
    rec = os.fspath(rec)
    offsets = []
    with open(rec, "wb") as f:
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            offsets.append(f.tell())
            header = struct.pack("<IfQQ", 0, float(label), ids[i] if ids else i, 0)
            f.write(_frame(header + image))
    if index:
        with open(os.path.splitext(rec)[0] + ".idx", "w") as f:
            f.writelines(f"{i}\t{o}\n" for i, o in enumerate(offsets))
    return rec


# ------------------------------------------------------------------------------------ TFRecord
def _masked_crc(data: bytes) -> int:
    from easyfit.data.sources.tfrecord import masked_crc

    return masked_crc(data)


def write_tfrecord(
    path: str | os.PathLike,
    images: Sequence[bytes],
    labels: Sequence[int | float],
    image_key: str = "image/encoded",
    label_key: str = "image/class/label",
    index: bool = True,
) -> str:
    """TFRecord of ``tf.train.Example``s (a float label as a ``float_list``, else an
    ``int64_list``); the index (``<path>.idx``) by DALI's tfrecord2idx."""
    from easyfit.data.protos import tf_example

    example = tf_example()
    path = os.fspath(path)
    with open(path, "wb") as f:
        for image, label in zip(images, labels, strict=True):
            ex = example()
            ex.features.feature[image_key].bytes_list.value.append(image)
            feature = ex.features.feature[label_key]
            if isinstance(label, float):  # a Python or NumPy float: a float_list
                feature.float_list.value.append(label)
            else:
                feature.int64_list.value.append(int(label))
            data = ex.SerializeToString()
            length = struct.pack("<Q", len(data))
            f.write(
                length + struct.pack("<I", _masked_crc(length)) + data + struct.pack("<I", _masked_crc(data))
            )
    if index:
        tool = Path(sys.executable).parent / "tfrecord2idx"
        subprocess.run([sys.executable, str(tool), path, path + ".idx"], check=True, capture_output=True)
    return path


# ---------------------------------------------------------------------------------- WebDataset
def write_webdataset(
    tar: str | os.PathLike, images: Sequence[bytes], labels: Sequence[int], ext: str = "png", start: int = 0
) -> str:
    """A tar shard of ``<key>.<ext>`` + ``<key>.cls`` members."""
    tar = os.fspath(tar)
    with tarfile.open(tar, "w") as t:
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            for name, data in (
                (f"{start + i:06d}.{ext}", image),
                (f"{start + i:06d}.cls", str(int(label)).encode()),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return tar


# ------------------------------------------------------------------------------------- NumPy
def write_npy_folder(root: str | os.PathLike, arrays: np.ndarray, labels: Sequence[int]) -> str:
    """``root/<label>/<n>.npy``."""
    for i, (a, label) in enumerate(zip(arrays, labels, strict=True)):
        folder = os.path.join(root, str(int(label)))
        os.makedirs(folder, exist_ok=True)
        np.save(os.path.join(folder, f"{i:05d}.npy"), a)
    return os.fspath(root)


# ------------------------------------------------------------------------------------- Parquet
def write_parquet(
    path: str | os.PathLike,
    images: Sequence[bytes | None],
    labels: Sequence[Any],
    *,
    struct: bool = True,
    class_names: Sequence[str] | None = None,
    row_group_size: int = 32,
    image: str = "image",
    label: str = "label",
    compression: str = "snappy",
) -> str:
    """A Parquet file of ``image`` (Hugging Face's Image struct, or plain binary without
    ``struct``) and ``label`` columns; ``class_names`` are written as Hugging Face writes a
    ``ClassLabel``'s (the schema's ``huggingface`` metadata); ``compression``: pyarrow's."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    if struct:
        kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        values = [None if b is None else {"bytes": b, "path": f"{i}.png"} for i, b in enumerate(images)]
        column = pa.array(values, kind)
    else:
        column = pa.array(list(images), pa.binary())
    table = pa.table({image: column, label: pa.array(list(labels))})
    if class_names is not None:
        features = {
            image: {"_type": "Image"},
            label: {"names": list(class_names), "_type": "ClassLabel"},
        }
        table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(table, os.fspath(path), row_group_size=row_group_size, compression=compression)
    return os.fspath(path)


def write_hf_splits(root: str | os.PathLike, splits: dict, shards: int = 2, **options) -> str:
    """``{split: (encoded images, labels)}`` as ``root/data/<split>-0000k-of-0000n.parquet``
    (:func:`write_parquet`'s ``options``)."""
    data = os.path.join(root, "data")
    os.makedirs(data, exist_ok=True)
    for split, (images, labels) in splits.items():
        bounds = np.linspace(0, len(images), shards + 1).astype(int)
        for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            name = os.path.join(data, f"{split}-{s:05d}-of-{shards:05d}.parquet")
            write_parquet(name, images[a:b], labels[a:b], **options)
    return os.fspath(root)


# ---------------------------------------------------------------------------- MNIST in a format
def mnist_in(fmt: str, root: str | os.PathLike, data: dict, limit: tuple[int, int], shards: int = 2) -> str:
    """MNIST (``data`` from ``ef.datasets.mnist_arrays``) as ``root/{train,val}`` in ``fmt``
    (``parquet``: Hugging Face's ``root/data/{train,validation}-*.parquet``)."""
    root = os.fspath(root)
    if fmt == "parquet":
        splits = {
            name: ([encode(img) for img in data[split][0][:n]], data[split][1][:n].astype(np.int64))
            for name, split, n in zip(("train", "validation"), ("train", "val"), limit, strict=True)
        }
        return write_hf_splits(root, splits, shards, class_names=[str(d) for d in range(10)])
    for split, n in zip(("train", "val"), limit, strict=True):
        x, y = data[split][0][:n], data[split][1][:n]
        out = os.path.join(root, split)
        if fmt == "npy":
            write_npy_folder(out, x, y)
            continue
        os.makedirs(out, exist_ok=True)
        pngs = [encode(img) for img in x]
        if fmt == "lmdb":
            write_lmdb(out, pngs, y)
        elif fmt == "recordio":
            write_recordio(os.path.join(out, "mnist.rec"), pngs, y)
        elif fmt in ("tfrecord", "webdataset"):
            bounds = np.linspace(0, n, shards + 1).astype(int)
            for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
                if fmt == "tfrecord":
                    write_tfrecord(os.path.join(out, f"mnist-{s}.tfrecord"), pngs[a:b], y[a:b])
                else:
                    write_webdataset(os.path.join(out, f"mnist-{s}.tar"), pngs[a:b], y[a:b], start=a)
        else:
            raise ValueError(fmt)
    return root


def write_idx_mnist(root: str | os.PathLike, data: dict) -> str:
    """``data`` (``{"train": (x, y), "val": (x, y)}``) as MNIST's four gzipped IDX files."""
    import gzip

    names = {
        "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
        "val": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
    }
    os.makedirs(root, exist_ok=True)
    for split, (x, y) in data.items():
        for name, arr in zip(
            names[split], (np.asarray(x, np.uint8).reshape(len(x), 28, 28), np.asarray(y, np.uint8))
        ):
            head = b"\0\0\x08" + bytes([arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
            with gzip.open(os.path.join(root, name), "wb", compresslevel=1) as f:
                f.write(head + arr.tobytes())
    return str(root)


def all_labels(source) -> np.ndarray:
    """Every label of ``source``, in order, as one batch of a real loader (what DALI is fed)."""
    import easyfit as ef
    from easyfit.data import Loader

    plan = ef.data.Plan(source.num_samples, source.num_samples, shuffle=False)
    loader = Loader(source, plan, ef.parallel.Placement.create())
    try:
        return np.asarray(next(loader)["y"])
    finally:
        loader.close()


# --------------------------------------------------------------------------------- Bad files
def write_folder(root) -> list[str]:
    """``root/{a,b}/<k>.jpg``, 3 small JPEGs each; the paths in ImageFolder order."""
    paths = []
    for k in range(6):
        path = os.path.join(root, "ab"[k // 3], f"{k}.jpg")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(encode(np.full((8, 8, 3), 40 * k, np.uint8), "jpeg"))
        paths.append(path)
    return paths


def break_three(paths: list[str]) -> list[str]:
    """A truncated JPEG, a file that is not an image and an empty file: their expected lines."""
    raw = open(paths[1], "rb").read()
    with open(paths[1], "wb") as f:
        f.write(raw[: len(raw) // 2])
    with open(paths[3], "wb") as f:
        f.write(b"these are notes, not pixels\n")
    open(paths[5], "wb").close()
    return [
        f"{paths[1]}: truncated JPEG (no end-of-image marker)",
        f"{paths[3]}: not an image (starts with b'these ar')",
        f"{paths[5]}: empty file",
    ]
