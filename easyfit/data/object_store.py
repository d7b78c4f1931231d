"""Object storage (``s3://bucket/prefix``): the client behind ``easyfit.data.storage.S3Storage``,
what easyfit does on the host for data in a bucket.

DALI reads an image folder's objects itself (``fn.io.file.read`` takes ``s3://`` paths: its
own AWS SDK client, configured by the standard AWS variables). What easyfit does on the host,
and the records of WebDataset and TFRecord shards (byte ranges of an object, which
``fn.io.file.read`` cannot read: :func:`read_object`, :func:`open_object`), goes through
boto3 (the optional extra ``easyfit-flax[s3]``), configured by the same variables
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``):

* listing: a bucket has no folders, so one paginated listing of a prefix gives the "folders"
  (the key parts between slashes) and the objects under it (:class:`Listing`), as
  ``os.path.isdir`` and ``easyfit.data.sources.folder.entries`` would;
* the state of an object, for the checks that a local file gets from ``os.stat``: its size and
  ETag, from the listing (:func:`known`, :func:`size`);
* the bytes easyfit reads itself (the images sampled for the image settings, the host-side
  check of each image before DALI decodes it): whole or ranged GETs (:func:`read_object`).

Every request is bounded by a connect and a read timeout and a few retries, and every failure
(an unreachable endpoint, a missing bucket, denied access) raises DataError naming the URL.
"""

from __future__ import annotations

import concurrent.futures
import io
import os
import posixpath
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, TypeVar

from ..errors import DataError

__all__ = [
    "CONNECT_TIMEOUT",
    "READ_TIMEOUT",
    "SCHEMES",
    "Listing",
    "check_all",
    "exists",
    "is_url",
    "known",
    "listing",
    "open_object",
    "read_object",
    "size",
    "split_url",
]

#: ``s3://bucket/key`` and ``gs://bucket/key``: an object in a bucket.
SCHEMES = ("s3://", "gs://")

#: Seconds to wait for a connection to the endpoint, and for each answer, per attempt.
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 20.0
_ATTEMPTS = 3  # boto3's "standard" retry mode: the first try and two retries
#: How long a listing is reused for the prefixes under it (``fit("s3://b/data")`` lists
#: ``data/`` once for ``train/`` and ``val/``), in seconds; never for its own prefix.
LISTING_REUSE = 60.0
_THREADS = 32  # host-side checks of a batch's objects run this many GETs at a time
_EXTRA = "pip install 'easyfit-flax[s3]'"


def is_url(path: Any) -> bool:
    """Whether ``path`` names object storage (``s3://`` or ``gs://``) rather than a local path.

    Example:
        >>> from easyfit.data.object_store import is_url
        >>> is_url("s3://bucket/data"), is_url("/data")
        (True, False)
    """
    return isinstance(path, str) and path.startswith(SCHEMES)


def split_url(url: str) -> tuple[str, str]:
    """``(bucket, key)`` of ``s3://bucket/key``; DataError for another scheme or no bucket.

    Example:
        >>> from easyfit.data.object_store import split_url
        >>> split_url("s3://bucket/data/train")
        ('bucket', 'data/train')
    """
    if url.startswith("gs://"):
        raise DataError(
            f"{url}: gs:// paths are not read by easyfit yet (DALI 2.4 reads them, as experimental, "
            "but easyfit lists and checks objects through the S3 API); use the bucket's "
            "S3-compatible endpoint (AWS_ENDPOINT_URL=https://storage.googleapis.com with HMAC "
            "keys) and an s3:// path, or copy the data to a local disk"
        )
    bucket, _, key = url[len("s3://") :].partition("/")
    if not bucket:
        raise DataError(f"{url}: no bucket; write s3://<bucket>/<prefix>")
    return bucket, key.strip("/")


_clients: dict[tuple[str | None, ...], Any] = {}  # by settings and timeouts
_clients_lock = threading.Lock()
_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
)


def _settings() -> tuple[str | None, ...]:
    """The AWS variables as they are now: what a client, and a listing, were made with."""
    return tuple(os.environ.get(v) for v in _ENV)


def _client(url: str) -> Any:
    """A boto3 S3 client configured by the AWS variables as they are now (one per setting,
    shared by threads: boto3's clients are thread-safe), with bounded timeouts and retries."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise DataError(f"{url}: reading object storage needs boto3; {_EXTRA}") from None
    key = (*_settings(), str(CONNECT_TIMEOUT), str(READ_TIMEOUT))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            config = Config(
                connect_timeout=CONNECT_TIMEOUT,
                read_timeout=READ_TIMEOUT,
                retries={"max_attempts": _ATTEMPTS, "mode": "standard"},
                max_pool_connections=_THREADS,
            )
            client = _clients[key] = boto3.session.Session().client("s3", config=config)
        return client


def _endpoint() -> str:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"


def _failure(url: str, e: Exception) -> DataError:
    """A DataError naming ``url``, what went wrong and the fix, from a boto3 exception."""
    from botocore import exceptions as x

    if isinstance(e, x.ClientError):
        code = str(e.response.get("Error", {}).get("Code", ""))
        message = e.response.get("Error", {}).get("Message") or code
        if code == "NoSuchBucket":
            bucket = split_url(url)[0]
            return DataError(f"{url}: no such bucket ({bucket!r} at {_endpoint()})")
        if code in ("NoSuchKey", "404", "NotFound"):
            return DataError(f"{url}: no such object")
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden"):
            return DataError(
                f"{url}: access denied ({code}: {message}); check AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or the profile), and that they may list and read the bucket"
            )
        return DataError(f"{url}: {code}: {message}")
    if isinstance(e, x.NoCredentialsError):
        return DataError(
            f"{url}: no credentials for object storage; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
        )
    if isinstance(e, x.ReadTimeoutError):
        return DataError(
            f"{url}: {_endpoint()} did not answer within {READ_TIMEOUT:g} s ({_ATTEMPTS} attempts); "
            "check AWS_ENDPOINT_URL and the network"
        )
    if isinstance(e, (x.EndpointConnectionError, x.ConnectTimeoutError)):
        return DataError(
            f"{url}: cannot reach {_endpoint()} ({e}; {_ATTEMPTS} attempts, {CONNECT_TIMEOUT:g} s "
            "connect timeout each); check AWS_ENDPOINT_URL and the network"
        )
    return DataError(f"{url}: {type(e).__name__}: {e}")


def _call(url: str, request: Callable[[], Any]) -> Any:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return request()
    except (BotoCoreError, ClientError) as e:
        raise _failure(url, e) from None


class Entry(NamedTuple):
    """An object or a "folder" under a listed prefix: what ``os.DirEntry`` gives of a local one."""

    name: str
    path: str


class Listing:
    """The objects under ``url`` (``s3://bucket/prefix``), listed once (paginated).

    :meth:`isdir` and :meth:`entries` answer as ``os.path.isdir`` and
    ``easyfit.data.storage.entries`` do for a local folder, for
    ``url`` and any prefix under it: a "folder" is a key part followed by a slash.
    """

    def __init__(self, url: str):
        bucket, key = split_url(url)
        self.url = f"s3://{bucket}/{key}".rstrip("/")
        self.bucket = bucket
        self.created = time.monotonic()
        self.settings = _settings()
        client = _client(url)
        prefix = key + "/" if key else ""
        self.objects: dict[str, tuple[int, str]] = {}  # URL -> (size, ETag)
        self._files: dict[str, list[Entry]] = {}
        self._dirs: dict[str, dict[str, Entry]] = {}
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in _call(self.url, lambda: list(pages)):
            for item in page.get("Contents", ()):
                path = f"s3://{bucket}/{item['Key']}"
                if path.endswith("/"):  # a "folder" object some tools write
                    self._add_dirs(path.rstrip("/"))
                    continue
                self.objects[path] = (int(item["Size"]), str(item.get("ETag", "")))
                parent, name = posixpath.split(path)
                self._files.setdefault(parent, []).append(Entry(name, path))
                self._add_dirs(parent)

    def _add_dirs(self, folder: str) -> None:
        """Records ``folder`` and every folder above it, up to the listed prefix."""
        while len(folder) > len(self.url):
            self._dirs.setdefault(folder, {})
            parent, name = posixpath.split(folder)
            self._dirs.setdefault(parent, {})[name] = Entry(name, folder)
            folder = parent
        self._dirs.setdefault(self.url, {})

    def covers(self, url: str) -> bool:
        """Whether ``url`` is under this listing's prefix (not the prefix itself)."""
        return url.rstrip("/").startswith(self.url + "/")

    def isdir(self, url: str) -> bool:
        """Whether ``url`` is a prefix holding objects (a bucket has no empty folders)."""
        return url.rstrip("/") in self._dirs

    def entries(self, url: str, kind: str = "file") -> list[Entry]:
        """The objects (``kind="file"``) or "folders" (``"dir"``) directly under ``url``."""
        url = url.rstrip("/")
        if kind == "file":
            return list(self._files.get(url, ()))
        return list(self._dirs.get(url, {}).values())


_listings: list[Listing] = []
_listings_lock = threading.Lock()
_known: dict[str, tuple[int, str]] = {}  # every listed object's (size, ETag), by URL


def listing(url: str) -> Listing:
    """A :class:`Listing` covering ``url``: the latest one of a prefix above it when made
    within :data:`LISTING_REUSE` seconds with the same AWS variables, else a new one (so
    ``fit("s3://b/data")`` lists ``data/`` anew, and its ``train/`` and ``val/`` from that
    listing); DataError naming ``url`` when the bucket cannot be listed."""
    now, settings = time.monotonic(), _settings()
    with _listings_lock:
        _listings[:] = [lst for lst in _listings if now - lst.created < LISTING_REUSE]
        for lst in reversed(_listings):
            if lst.covers(url) and lst.settings == settings:
                return lst
    made = Listing(url)
    with _listings_lock:
        _listings.append(made)
        _known.update(made.objects)
    return made


def known(url: str) -> tuple[int, str] | None:
    """``(size, ETag)`` of a listed (or asked) object; None when it was not."""
    return _known.get(url)


def size(url: str) -> int:
    """The size of a listed object, -1 when it was not listed (as a local file that cannot be
    stat'ed)."""
    found = known(url)
    return -1 if found is None else found[0]


def _head(url: str) -> tuple[int, str]:
    """``(size, ETag)`` of one object, asked of the store (and remembered as a listed one's)."""
    bucket, key = split_url(url)
    client = _client(url)
    found = _call(url, lambda: client.head_object(Bucket=bucket, Key=key))
    known = (int(found["ContentLength"]), str(found.get("ETag", "")))
    _known[url] = known
    return known


def exists(url: str) -> bool:
    """Whether object ``url`` exists: listed, else asked of the store (one HEAD request); a
    failure other than a missing object raises DataError naming it."""
    if url in _known:
        return True
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split_url(url)
    if not key:
        return False
    client = _client(url)
    try:
        found = client.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        if str(e.response.get("Error", {}).get("Code", "")) in ("NoSuchKey", "404", "NotFound"):
            return False
        raise _failure(url, e) from None
    except BotoCoreError as e:
        raise _failure(url, e) from None
    _known[url] = (int(found["ContentLength"]), str(found.get("ETag", "")))
    return True


class _Ranged(io.RawIOBase):
    """A listed object as a read-only seekable file: each read is a ranged GET."""

    def __init__(self, url: str):
        self.url = url
        self.length = size(url) if known(url) else _head(url)[0]
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.length - self.pos)
        if n <= 0:
            return 0
        data = read_object(self.url, self.pos, n)
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def open_object(url: str, buffer: int = 1 << 20) -> io.BufferedReader:
    """Object ``url`` as a buffered binary file (``buffer`` bytes per ranged GET): for code that
    walks a file's headers, as ``tarfile`` does a WebDataset shard's."""
    return io.BufferedReader(_Ranged(url), buffer)


def read_object(url: str, start: int = 0, length: int | None = None) -> bytes:
    """The bytes of object ``url`` (``length`` bytes from ``start`` when given: a ranged GET);
    DataError naming it when it cannot be read."""
    bucket, key = split_url(url)
    client = _client(url)
    extra = {} if length is None and start == 0 else {"Range": f"bytes={start}-{start + (length or 0) - 1}"}
    body = _call(url, lambda: client.get_object(Bucket=bucket, Key=key, **extra)["Body"].read())
    return bytes(body)


_pool: concurrent.futures.ThreadPoolExecutor | None = None


_T = TypeVar("_T")


def check_all(check: Callable[[int], _T], indices: Iterable[int]) -> list[_T]:
    """``[check(i) for i in indices]``, run :data:`_THREADS` at a time: each check (or read) of
    an object waits on its GETs, which a sequential loop would add up."""
    global _pool
    with _clients_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(_THREADS, "easyfit-object-store")
    return list(_pool.map(check, indices))
