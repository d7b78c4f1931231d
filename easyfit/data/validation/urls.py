"""The prefixes of a path that names object storage rather than a local file: defined here, in
the package that imports the standard library alone, for its file checks and for
:func:`easyfit.data.object_store.is_url` alike."""

from __future__ import annotations

__all__ = ["URL_SCHEMES"]

#: ``s3://bucket/key`` and ``gs://bucket/key``: an object in a bucket.
URL_SCHEMES = ("s3://", "gs://")
