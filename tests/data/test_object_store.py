"""s3:// data paths, for real: an S3-compatible server (moto's) on 127.0.0.1, started and
stopped here; the MNIST sample uploaded to it is read back by DALI and trained on, with the
same parameters as from the local copy. A missing bucket, denied access and an unreachable
endpoint raise DataError naming the URL, bounded by timeouts (no hang)."""

from __future__ import annotations

import os
import socket

import jax
import numpy as np
import optax
import pytest
from flax import linen as nn

import easyfit as ef
from easyfit.data import object_store
from easyfit.errors import DataError

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

BUCKET = "easyfit-data"


@pytest.fixture(scope="module")
def server():
    """The server's URL, with the AWS variables pointing at it for the module's tests."""
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    url = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_ENDPOINT_URL", url)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_REGION", "us-east-1")
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata look-ups
        yield url
    srv.stop()


@pytest.fixture(scope="module")
def mnist(server, tmp_path_factory):
    """``(local root, s3 root)`` of the MNIST sample (200 training, 100 validation PNGs)."""
    root = ef.datasets.sample_folder(tmp_path_factory.mktemp("s3") / "mnist", limit=(200, 100))
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    return root, _upload(client, root, "mnist")


def _model():
    return nn.Sequential([lambda x: x.reshape((x.shape[0], -1)), nn.Dense(10)])


def _fit(data, epochs=2):
    trainer = ef.Trainer(_model(), optimizer=optax.sgd(0.1), seed=0)
    history = trainer.fit(data, epochs=epochs, batch_size=50, verbose=0)
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(trainer.params)], history.history


def test_image_folder_lists_class_folders_from_the_bucket(mnist):
    local, remote = mnist
    here = ef.data.ImageFolder(local + "/train")
    there = ef.data.ImageFolder(remote + "/train")
    assert there.class_names == here.class_names
    assert [os.path.relpath(f, local) for f in here.files] == [f[len(remote) + 1 :] for f in there.files]
    np.testing.assert_array_equal(there.labels, here.labels)
    assert there.image_shape == here.image_shape == (28, 28, 1)


def test_fit_from_s3_gives_the_same_parameters_as_the_local_copy(mnist):
    local, remote = mnist
    from_disk, h_disk = _fit(local)
    from_bucket, h_bucket = _fit(remote)
    assert set(h_bucket) == set(h_disk) and "val_loss" in h_bucket  # train/ and test/ both found
    for a, b in zip(from_disk, from_bucket, strict=True):
        np.testing.assert_array_equal(a, b)  # CPU: bit for bit
    np.testing.assert_array_equal(h_disk["loss"], h_bucket["loss"])


def test_data_fingerprint_of_s3_files_holds_their_sizes(mnist):
    from easyfit.persistence.fingerprint import data_fingerprint

    local, remote = mnist
    listed = ef.data.ImageFolder(remote + "/train")
    assert data_fingerprint(listed) == data_fingerprint(ef.data.ImageFolder(local + "/train"))
    client = boto3.client("s3")
    for f in listed.files:  # the same names under another prefix, one object a byte longer
        client.copy_object(Bucket=BUCKET, Key="grown/" + f[len(remote) + 1 :], CopySource=f[len("s3://") :])
    key = "grown/" + listed.files[7][len(remote) + 1 :]
    body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    client.put_object(Bucket=BUCKET, Key=key, Body=body + b"\0")
    grown = data_fingerprint(ef.data.ImageFolder(f"s3://{BUCKET}/grown/train"))
    same = data_fingerprint(listed)
    assert grown["files"] != same["files"] and {**grown, "files": 0} == {**same, "files": 0}


def test_class_folders_in_the_bucket_are_walked_at_any_depth_as_the_local_copy(mnist, tmp_path):
    """Issue 48: sub-folders of a class folder, from the prefix's one listing, in the local
    walk's order; what is left out is counted alike (listing only: sizes given, no image read)."""
    for path in (
        "a/1.png",
        "a/sub/deeper/0.png",
        "a/sub/2.png",
        "a/.hidden.png",
        "b/x.txt",
        "b/3.png",
        "4.png",
    ):
        os.makedirs(os.path.dirname(tmp_path / "nested" / path), exist_ok=True)
        (tmp_path / "nested" / path).write_bytes(b"\0")
    remote = _upload(boto3.client("s3"), str(tmp_path / "nested"), "nested")
    listed = {"image_size": (4, 4), "color_mode": "grayscale"}
    here, there = ef.data.ImageFolder(tmp_path / "nested", **listed), ef.data.ImageFolder(remote, **listed)
    assert [f[len(remote) + 1 :] for f in there.files] == [
        "a/1.png",
        "a/sub/2.png",
        "a/sub/deeper/0.png",
        "b/3.png",
    ]
    assert [os.path.relpath(f, tmp_path / "nested") for f in here.files] == [
        f[len(remote) + 1 :] for f in there.files
    ]
    assert there.left_out.replace(remote, "R") == here.left_out.replace(str(tmp_path / "nested"), "R")
    unlabelled = ef.data.ImageFiles(remote, **listed)
    assert [f[len(remote) + 1 :] for f in unlabelled.files] == [
        "4.png",
        *(f[len(remote) + 1 :] for f in there.files),
    ]


def test_a_broken_image_in_the_bucket_is_named_before_dali_decodes_it(server, mnist):
    local, _ = mnist
    client = boto3.client("s3")
    names = sorted(os.listdir(local + "/train/3"))
    for name in names:
        with open(os.path.join(local, "train/3", name), "rb") as f:
            client.put_object(Bucket=BUCKET, Key=f"broken/3/{name}", Body=f.read())
    with open(os.path.join(local, "train/3", names[1]), "rb") as f:
        data = f.read()
    client.put_object(Bucket=BUCKET, Key=f"broken/3/{names[1]}", Body=data[: len(data) // 2])
    trainer = ef.Trainer(_model(), optimizer=optax.sgd(0.1), seed=0)
    with pytest.raises(DataError, match=f"s3://{BUCKET}/broken/3/{names[1]}: truncated PNG"):
        trainer.fit(f"s3://{BUCKET}/broken", epochs=1, batch_size=len(names), verbose=0)


def test_a_missing_bucket_is_named(server):
    with pytest.raises(DataError, match=r"s3://no-such-bucket/data/train: no such bucket"):
        ef.data.ImageFolder("s3://no-such-bucket/data/train")


def test_an_empty_prefix_is_no_directory(mnist):
    with pytest.raises(DataError, match=f"s3://{BUCKET}/nothing-here: no such directory"):
        ef.data.ImageFolder(f"s3://{BUCKET}/nothing-here")


def _auth_checks(endpoint: str, after: bytes) -> None:
    """Turns moto's IAM checks on after ``after`` more requests (``b"inf"``: never)."""
    import urllib.request

    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=after, method="POST", headers={"Content-Type": "text/plain"}
    )
    urllib.request.urlopen(request, timeout=5).close()


def test_wrong_credentials_are_denied_access(mnist, monkeypatch):
    """moto checks the keys once its IAM checks are on (``/moto-api/reset-auth``): an unknown
    key, and a known one with no policy that allows reading."""
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    iam = boto3.client("iam", region_name="us-east-1")
    user = iam.create_user(UserName="reader")["User"]["UserName"]
    key = iam.create_access_key(UserName=user)["AccessKey"]  # a real key, with no policy
    _auth_checks(endpoint, b"0")  # from now on every request is checked
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wrong")
        with pytest.raises(DataError, match=f"s3://{BUCKET}/mnist/train: access denied"):
            ef.data.ImageFolder(f"s3://{BUCKET}/mnist/train")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        with pytest.raises(DataError, match=f"s3://{BUCKET}/mnist/val: access denied"):
            ef.data.ImageFolder(f"s3://{BUCKET}/mnist/val")
    finally:
        _auth_checks(endpoint, b"inf")  # moto's default: none


def test_an_unreachable_endpoint_is_named_not_waited_on(monkeypatch):
    with socket.socket() as s:  # a port nothing listens on: bound, then closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with pytest.raises(DataError, match=rf"s3://{BUCKET}/mnist/train: cannot reach http://127.0.0.1:{port}"):
        ef.data.ImageFolder(f"s3://{BUCKET}/mnist/train")


def _upload(client, root: str, prefix: str) -> str:
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            client.upload_file(path, BUCKET, prefix + "/" + os.path.relpath(path, root).replace(os.sep, "/"))
    return f"s3://{BUCKET}/{prefix}"


def test_an_endpoint_that_never_answers_is_named_after_its_timeout(monkeypatch):
    with socket.socket() as s:  # accepts connections (the kernel's backlog), never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{s.getsockname()[1]}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        monkeypatch.setattr(object_store, "READ_TIMEOUT", 0.5)
        silent = rf"s3://{BUCKET}/mnist/train: http://127.0.0.1:\d+ did not answer within 0.5 s"
        with pytest.raises(DataError, match=silent):
            ef.data.ImageFolder(f"s3://{BUCKET}/mnist/train")


@pytest.mark.parametrize("fmt", ["webdataset", "tfrecord"])
def test_record_shards_from_s3_train_as_the_local_copy(mnist, mnist_arrays, tmp_path, fmt):
    from tests.helpers.formats import mnist_in

    local = mnist_in(fmt, tmp_path / fmt, mnist_arrays, (100, 50))
    remote = _upload(boto3.client("s3"), local, fmt)
    kind = ef.data.WebDataset if fmt == "webdataset" else ef.data.TFRecord
    there = kind(remote + "/train")
    assert len(there) == 100 and [f[len(remote) + 1 :] for f in there.files] == [
        os.path.relpath(f, local) for f in kind(local + "/train").files
    ]
    from_disk, h_disk = _fit(local, epochs=1)
    from_bucket, h_bucket = _fit(remote, epochs=1)
    for a, b in zip(from_disk, from_bucket, strict=True):
        np.testing.assert_array_equal(a, b)  # CPU: bit for bit
    np.testing.assert_array_equal(h_disk["val_loss"], h_bucket["val_loss"])


def test_a_tfrecord_without_its_index_is_walked_from_the_bucket(mnist, mnist_arrays, tmp_path):
    from tests.helpers.formats import mnist_in

    local = mnist_in("tfrecord", tmp_path / "tf", mnist_arrays, (60, 10))
    client = boto3.client("s3")
    for shard in sorted(os.listdir(local + "/train")):
        if not shard.endswith(".idx"):
            client.upload_file(os.path.join(local, "train", shard), BUCKET, f"noidx/{shard}")
    walked = ef.data.TFRecord(f"s3://{BUCKET}/noidx")
    indexed = ef.data.TFRecord(local + "/train")
    for got, want in zip(walked.records_layout()[:3], indexed.records_layout()[:3], strict=True):
        np.testing.assert_array_equal(got, want)  # each record's file, offset and length
    assert walked.encoded_image(59) == indexed.encoded_image(59)
    first = sorted(os.listdir(local + "/train"))[0]  # one object, named by its whole key
    assert len(ef.data.TFRecord(f"s3://{BUCKET}/noidx/{first}")) == 30


@pytest.mark.parametrize(
    ("keys", "kind"),
    [
        (["wds/mnist.rec", "wds/mnist.idx"], "RecordIO"),
        (["wds/data.mdb"], "Caffe2LMDB"),
        (["wds/train-00000-of-00001.parquet"], "Parquet"),
        (["wds/images/a.png", "wds/masks/a.png"], "SegmentationFolder"),
    ],
)
def test_other_formats_on_s3_are_refused_with_the_fix(server, keys, kind):
    client = boto3.client("s3")
    bucket = "shards-" + kind.lower()
    client.create_bucket(Bucket=bucket)
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=b"\0" * 1024)
    with pytest.raises(DataError, match=f"s3://{bucket}/wds: {kind} data on object storage is not read"):
        ef.Trainer(_model(), optimizer=optax.sgd(0.1)).fit(f"s3://{bucket}/wds", epochs=1, verbose=0)


def test_an_object_deleted_after_listing_is_named(server, mnist):
    local, _ = mnist
    client = boto3.client("s3")
    names = sorted(os.listdir(local + "/train/5"))
    for name in names:
        client.upload_file(os.path.join(local, "train/5", name), BUCKET, f"gone/5/{name}")
    folder = ef.data.ImageFolder(f"s3://{BUCKET}/gone")
    client.delete_object(Bucket=BUCKET, Key=f"gone/5/{names[2]}")
    trainer = ef.Trainer(_model(), optimizer=optax.sgd(0.1), seed=0)
    with pytest.raises(DataError, match=f"s3://{BUCKET}/gone/5/{names[2]}: cannot be read \\(no such object"):
        trainer.fit(folder, epochs=1, batch_size=len(names), verbose=0)


def test_gs_paths_say_what_to_do():
    with pytest.raises(DataError, match="gs://bucket/data: gs:// paths are not read by easyfit yet"):
        ef.data.ImageFolder("gs://bucket/data")


def test_is_url_tells_object_storage_from_local_paths():
    assert object_store.is_url("s3://b/k") and object_store.is_url("gs://b/k")
    assert not object_store.is_url("/data/s3://x") and not object_store.is_url("data")


def test_a_prefix_is_listed_anew_each_time_it_is_read(server, mnist):
    local, _ = mnist
    client = boto3.client("s3")
    names = sorted(os.listdir(local + "/train/2"))
    for name in names[:-1]:
        client.upload_file(os.path.join(local, "train/2", name), BUCKET, f"fresh/2/{name}")
    assert len(ef.data.ImageFolder(f"s3://{BUCKET}/fresh")) == len(names) - 1
    client.upload_file(os.path.join(local, "train/2", names[-1]), BUCKET, f"fresh/2/{names[-1]}")
    assert len(ef.data.ImageFolder(f"s3://{BUCKET}/fresh")) == len(names)


def test_easyfit_check_lists_every_bad_object_of_a_prefix(server, tmp_path):
    from tests.helpers.formats import break_three, encode, write_folder, write_tfrecord

    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    expected = break_three(write_folder(tmp_path / "folder"))
    images = [encode(np.zeros((8, 8, 1), np.uint8)) for _ in range(4)]
    images[2] = b"notes"
    os.makedirs(tmp_path / "records")
    write_tfrecord(tmp_path / "records" / "a.tfrecord", images, [0, 1, 0, 1])
    folder = _upload(client, str(tmp_path / "folder"), "bad-folder")
    assert ef.data.check(folder) == [line.replace(str(tmp_path / "folder"), folder) for line in expected]
    records = _upload(client, str(tmp_path / "records"), "bad-records")
    found = ef.data.check(records)
    assert len(found) == 1 and found[0].startswith(f"{records}/a.tfrecord: record 2 ")
    assert found[0].endswith(": not an image (starts with b'notes')")


@pytest.mark.slow
def test_an_objects_stamp_is_the_same_in_another_process(mnist, monkeypatch):
    from easyfit.data.storage import storage_for
    from tests.helpers import run_python

    url = f"s3://{BUCKET}/mnist/train/0"
    listing = storage_for(url).listdir(url)
    path = listing.files[0].path
    here = storage_for(path).stamp(path)
    assert here is not None and here == listing.files[0].stamp
    monkeypatch.setenv("PYTHONHASHSEED", "1")  # Python's hash() of its ETag differs there
    code = (
        "from easyfit.data.storage import storage_for\n"
        f"s = storage_for({url!r}); s.listdir({url!r}); print(s.stamp({path!r}))"
    )
    assert int(run_python("-c", code).strip().splitlines()[-1]) == here
