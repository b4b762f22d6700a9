"""Artifact bytes in an S3-compatible bucket: the optional ``s3`` extra
(``pip install 'protomolt-jobs[s3]'``; docs/artifacts.md *Cancel, retention and the byte store*).

:class:`S3ArtifactStore` is an ``ArtifactStore`` (``hooks/contract.py``) over one bucket and
an optional key prefix; :class:`S3ArtifactStorePlugin` hands it to the host through the
``protomolt_artifact_store`` hook (register it as a plugin: an entry point of the
``protomolt.roles`` group, or ``extra_plugins`` of ``compose``). Keys and uris are the file
store's (``artifact://<key>``): a run's ports read the same whichever store holds the bytes.
``boto3`` is imported when a store is built, so the module imports without the extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from protomolt_jobs.hooks.hookspecs import hookimpl
from protomolt_jobs.runs.artifact_store import uri_of

__all__ = ["S3ArtifactStore", "S3ArtifactStorePlugin"]

#: The error codes S3 answers for a key that is not there.
_MISSING = {"NoSuchKey", "404", "NotFound"}


class S3ArtifactStore:
    """Artifact bytes as objects ``<prefix><key>`` of ``bucket``.

    :param bucket: the bucket (it must exist).
    :param prefix: prepended to every key (e.g. ``"protomolt/"``).
    :param client: a boto3 S3 client; None: ``boto3.client("s3", **client_kwargs)``
        (``endpoint_url``, ``region_name``, credentials ...: boto3's own settings otherwise).
    :raises ImportError: boto3 is not installed (the ``s3`` extra).
    """

    def __init__(
        self, bucket: str, *, prefix: str = "", client: Any = None, **client_kwargs: Any
    ) -> None:
        if client is None:
            import boto3

            client = boto3.client("s3", **client_kwargs)
        self.bucket = bucket
        self.prefix = prefix
        self.client = client

    def _object(self, key: str) -> str:
        uri_of(key)  # the file store's key rules: ValueError for a malformed key
        return self.prefix + key

    def put(self, key: str, data: bytes) -> str:
        """Store ``data`` under ``key``; returns ``artifact://<key>``."""
        self.client.put_object(Bucket=self.bucket, Key=self._object(key), Body=bytes(data))
        return uri_of(key)

    def get(self, key: str) -> bytes | None:
        """The bytes under ``key``, or None when missing."""
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._object(key))
        except self.client.exceptions.ClientError as exc:
            if _code(exc) in _MISSING:
                return None
            raise
        data: bytes = answer["Body"].read()
        return data

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._object(key))
        except self.client.exceptions.ClientError as exc:
            if _code(exc) in _MISSING:
                return False
            raise
        return True

    def delete(self, key: str) -> bool:
        """Remove ``key``; False when it was already missing (never an error)."""
        if not self.exists(key):
            return False
        self.client.delete_object(Bucket=self.bucket, Key=self._object(key))
        return True


def _code(exc: Any) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


class S3ArtifactStorePlugin:
    """A host plugin answering ``protomolt_artifact_store`` with an :class:`S3ArtifactStore`
    (the arguments are the store's)."""

    def __init__(self, bucket: str, **store_kwargs: Any) -> None:
        self.bucket = bucket
        self.store_kwargs = store_kwargs

    @hookimpl
    def protomolt_artifact_store(self, data_dir: Path) -> S3ArtifactStore:
        return S3ArtifactStore(self.bucket, **self.store_kwargs)
