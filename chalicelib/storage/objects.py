"""Object stores the event log and the tuning job use: a local directory or an S3 bucket
(``observability.event_store.ObjectStore``), and the ``KVCM_EVENT_LOG`` value naming one."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from ..observability.event_store import DIR_SCHEME, S3_SCHEME, ObjectStore


class DirectoryStore:
    """Objects as files under ``root`` (keys are relative paths)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def put(self, key: str, body: bytes) -> None:
        path = os.path.join(self.root, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = path + ".partial"
        with open(partial, "wb") as handle:
            handle.write(body)
        os.replace(partial, path)  # readers never see half an object

    def keys(self, prefix: str) -> Iterator[str]:
        base = os.path.join(self.root, prefix)
        for directory, _, files in sorted(os.walk(base)):
            for name in sorted(files):
                if not name.endswith(".partial"):
                    yield os.path.relpath(os.path.join(directory, name), self.root).replace(os.sep, "/")

    def get(self, key: str) -> bytes:
        with open(os.path.join(self.root, key), "rb") as handle:
            return handle.read()

    def uri(self, key: str) -> str:
        return os.path.join(self.root, key)


class S3Store:
    """Objects in one S3 bucket (``client`` is a boto3 S3 client, built on first use)."""

    def __init__(self, client: Callable[[], Any], bucket: str) -> None:
        self._client = client
        self.bucket = bucket

    def put(self, key: str, body: bytes) -> None:
        self._client().put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/x-ndjson")

    def keys(self, prefix: str) -> Iterator[str]:
        paginator = self._client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", ()):
                yield item["Key"]

    def get(self, key: str) -> bytes:
        data: bytes = self._client().get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return data

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"


def open_store(target: str, s3_client: Callable[[], Any]) -> tuple[ObjectStore, str]:
    """The store and key prefix ``target`` names: ``s3://bucket/prefix``, ``dir:/path`` or
    ``/path/``."""
    if target.startswith(S3_SCHEME):
        bucket, _, prefix = target[len(S3_SCHEME) :].partition("/")
        if not bucket:
            raise ValueError(f"event log {target!r} names no bucket")
        return S3Store(s3_client, bucket), prefix.strip("/")
    root = target[len(DIR_SCHEME) :] if target.startswith(DIR_SCHEME) else target
    if not root:
        raise ValueError(f"event log {target!r} names no directory")
    return DirectoryStore(root), ""
