"""S3 storage (``s3{bucket, prefix, region}``): one object per block per spec.

Object key: ``<prefix>/<instance id>/<spec name>/<block key as 16 hex digits>``; the
prefix is stripped of slashes and left out when empty, the instance id and spec name are
escaped (``naming.escape_component``) so a ``/`` in them cannot fold two names together.

URI: ``s3://<global_unique_name>/<object key>?size=<spec size>``. The host is the storage
name like every other KVCM URI (API.md), not the bucket: the connector finds the bucket
and region in the ``storage_configs`` that registerInstance returned.

The boto3 client comes from a zero-argument factory and is built on first use, so a
backend costs nothing until it does I/O and tests can hand in a client for moto. One
client serves buckets of every region: botocore follows S3's wrong-region redirects, and
``region`` is there for the engines' connectors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ..protocol.codes import StorageType
from ..protocol.models import StorageConfig
from .base import BlockRef, SpecSlot, StorageBackend, StorageError, StorageUnavailableError, UriFormat, check_shapes
from .checks import config_error, require, spec_of
from .naming import HEX64, block_key_args, escape_component, hex64, uri_template

#: S3's limit of keys per DeleteObjects call.
DELETE_BATCH = 1000
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}

S3ClientFactory = Callable[[], Any]


def _describe(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', '?')}: {error.get('Message', '')}".rstrip(": ")
    return str(exc)


class S3Backend(StorageBackend):
    """Blocks as S3 objects; ``client_factory`` returns a boto3 S3 client."""

    storage_type = StorageType.ST_S3
    spec_field = "s3"
    sdk_type = "s3"
    read_weight = 8

    def __init__(self, config: StorageConfig, client_factory: S3ClientFactory) -> None:
        self.check_config(config)
        super().__init__(config)
        spec = spec_of(config, self.spec_field)
        self.bucket = spec.bucket
        self.prefix = spec.prefix.strip("/")
        self.region = spec.region
        self._client_factory = client_factory
        self._client: Any | None = None
        self._lock = threading.Lock()

    @classmethod
    def check_config(cls, config: StorageConfig) -> None:
        """Raise InvalidArgumentError naming the first invalid ``s3`` field."""
        spec = spec_of(config, cls.spec_field)
        require(config, "s3.bucket", spec.bucket)
        if "/" in spec.bucket:
            raise config_error(config, "s3.bucket", f"is a bucket name, not a path: {spec.bucket!r}")

    @property
    def client(self) -> Any:
        """The boto3 client, built on first use (boto3 clients are thread-safe)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._client_factory()
        return self._client

    def _key_head(self, instance_id: str, spec_name: str) -> str:
        parts = [escape_component(instance_id), escape_component(spec_name), ""]
        return "/".join([self.prefix, *parts] if self.prefix else parts)

    def object_key(self, instance_id: str, spec_name: str, block_key: int) -> str:
        """The object key of one spec of a block."""
        return self._key_head(instance_id, spec_name) + hex64(block_key)

    def uri_format(self, instance_id: str, spec: SpecSlot) -> UriFormat:
        return UriFormat(
            uri_template(
                self.sdk_type, self.name, ("/" + self._key_head(instance_id, spec.name), HEX64), (("size", spec.size),)
            ),
            block_key_args,
        )

    def _keys(self, blocks: Sequence[BlockRef]) -> Iterator[str]:
        for block in blocks:
            for spec in block.specs:
                yield self.object_key(block.instance_id, spec.name, block.block_key)

    def delete(self, blocks: Sequence[BlockRef]) -> None:
        """DeleteObjects in batches of 1000; absent objects are not errors."""
        keys = list(dict.fromkeys(self._keys(blocks)))
        failures: list[str] = []
        # Every batch is attempted before failing, so one bad batch does not stall the rest.
        for start in range(0, len(keys), DELETE_BATCH):
            batch = keys[start : start + DELETE_BATCH]
            try:
                response = self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
                )
            except (ClientError, BotoCoreError) as exc:
                failures.append(f"{len(batch)} key(s) from {batch[0]}: {_describe(exc)}")
                continue
            failures.extend(
                f"{e.get('Key')}: {e.get('Code')}: {e.get('Message', '')}" for e in response.get("Errors", [])
            )
        if failures:
            raise StorageError(
                f"storage {self.name}: delete from s3://{self.bucket} failed for "
                f"{len(failures)} item(s): {'; '.join(failures[:3])}"
            )

    def exists(self, block: BlockRef) -> bool:
        """HeadObject for every spec. S3 writes are atomic, so presence means complete."""
        for key in self._keys([block]):
            try:
                self.client.head_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in _NOT_FOUND:
                    return False
                raise StorageError(f"storage {self.name}: head s3://{self.bucket}/{key}: {_describe(exc)}") from exc
            except BotoCoreError as exc:
                raise StorageError(f"storage {self.name}: head s3://{self.bucket}/{key}: {exc}") from exc
        return True

    def read(self, blocks: Sequence[BlockRef]) -> list[list[bytes]]:
        """GetObject for every spec; a missing object or one of another size is a StorageError."""
        out: list[list[bytes]] = []
        for block in blocks:
            row = []
            for spec in block.specs:
                key = self.object_key(block.instance_id, spec.name, block.block_key)
                try:
                    data: bytes = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                except (ClientError, BotoCoreError) as exc:
                    raise StorageError(f"storage {self.name}: get s3://{self.bucket}/{key}: {_describe(exc)}") from exc
                if len(data) != spec.size:
                    raise StorageError(
                        f"storage {self.name}: s3://{self.bucket}/{key} holds {len(data)} bytes, not {spec.size}"
                    )
                row.append(data)
            out.append(row)
        return out

    def write(self, blocks: Sequence[BlockRef], data: Sequence[Sequence[bytes]]) -> None:
        """PutObject for every spec (S3 stores an object whole and durably, or not at all)."""
        check_shapes(self.name, blocks, data)
        for block, payloads in zip(blocks, data, strict=True):
            for spec, payload in zip(block.specs, payloads, strict=True):
                key = self.object_key(block.instance_id, spec.name, block.block_key)
                try:
                    self.client.put_object(Bucket=self.bucket, Key=key, Body=payload)
                except (ClientError, BotoCoreError) as exc:
                    raise StorageError(f"storage {self.name}: put s3://{self.bucket}/{key}: {_describe(exc)}") from exc

    def probe(self) -> None:
        """HeadBucket: the bucket exists and these credentials may use it."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except (ClientError, BotoCoreError) as exc:
            raise StorageUnavailableError(
                f"storage {self.name}: bucket {self.bucket!r} unusable: {_describe(exc)}"
            ) from exc
