"""Harnesses that run one contract against every backend.

A harness owns a healthy backend, places blocks the way the index does (explicit group
ids from ``reserve``, or location ids packed ``pack_count`` to a group), writes data
where the URIs point, removes blocks the way the index does (``delete`` or
``delete_groups``) and builds a broken twin whose probe must fail.
"""

from __future__ import annotations

import itertools
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from urllib.parse import parse_qs, unquote

import boto3

from chalicelib.protocol.models import StorageConfig
from chalicelib.storage import (
    BlockRef,
    MooncakeBackend,
    S3Backend,
    SpecSlot,
    StorageBackend,
    TairMemPoolBackend,
)
from tests.fakes.mooncake import FakeMooncakeStore
from tests.helpers import free_port

SPECS = (SpecSlot("tp0", 0, 64), SpecSlot("tp1", 64, 32))


def split_uri(uri: str) -> tuple[str, str, str, dict[str, str]]:
    """scheme, host, unquoted path, query of a KVCM URI (urlsplit rejects "vcns_hf3fs")."""
    scheme, _, rest = uri.partition("://")
    rest, _, query = rest.partition("?")
    host, slash, path = rest.partition("/")
    return scheme, host, unquote(slash + path), {k: v[0] for k, v in parse_qs(query).items()}


class Harness(ABC):
    """Contract driver for one backend; subclasses know where its data lives."""

    #: False when KVCM cannot observe the data itself (exists = allocation is live).
    tracks_data = True

    def __init__(self, backend: StorageBackend) -> None:
        self.backend = backend
        self._location_ids = itertools.count(1000)

    def place(self, instance_id: str, block_keys: Sequence[int], specs=SPECS) -> list[BlockRef]:
        """BlockRefs for new blocks of one startWriteCache call, placed like the index does."""
        block_bytes = sum(s.size for s in specs)
        locations = [next(self._location_ids) for _ in block_keys]
        pack = self.backend.pack_count
        if pack > 0:
            groups = [locations[i - i % pack] for i in range(len(block_keys))]
            slots = [i % pack for i in range(len(block_keys))]
        else:
            explicit = self.backend.reserve(instance_id, len(block_keys), block_bytes)
            groups = explicit or [0] * len(block_keys)
            slots = [0] * len(block_keys)
        blocks = [
            BlockRef(instance_id, key, loc, group, slot, tuple(specs))
            for key, loc, group, slot in zip(block_keys, locations, groups, slots, strict=True)
        ]
        self.backend.prepare(blocks)
        return blocks

    def write(self, block: BlockRef) -> None:
        """Write every spec of ``block`` where its URI points."""
        for spec in block.specs:
            self.write_uri(self.backend.uri(block, spec), spec.size)

    @abstractmethod
    def write_uri(self, uri: str, size: int) -> None:
        """Write ``size`` bytes at ``uri`` as an engine would."""

    @abstractmethod
    def read_uri(self, uri: str, size: int) -> bytes:
        """The ``size`` bytes at ``uri``, read as an engine would (fewer if they are not there)."""

    def read_block(self, block: BlockRef) -> list[bytes]:
        """Every spec of ``block``, read at its URI."""
        return [self.read_uri(self.backend.uri(block, spec), spec.size) for spec in block.specs]

    def remove(self, blocks: Sequence[BlockRef]) -> None:
        """What the index does once these blocks (whole groups, if packed) are gone."""
        if self.backend.pack_count > 0:
            groups = list(dict.fromkeys(b.group_id for b in blocks))
            self.backend.delete_groups(blocks[0].instance_id, groups, blocks[0].specs)
        else:
            self.backend.delete(blocks)

    @abstractmethod
    def broken(self) -> StorageBackend:
        """The same kind of backend pointed at a storage that is not there."""


class FileHarness(Harness):
    def write_uri(self, uri, size):
        """At byte ``blkid × size`` of the URI's path, as upstream's engine SDK does."""
        _, _, path, query = split_uri(uri)
        assert int(query["size"]) == size
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "r+b" if os.path.exists(path) else "wb") as handle:
            handle.seek(int(query.get("blkid", 0)) * size)
            handle.write(os.urandom(size))

    def read_uri(self, uri, size):
        _, _, path, query = split_uri(uri)
        assert int(query["size"]) == size
        with open(path, "rb") as handle:
            handle.seek(int(query.get("blkid", 0)) * size)
            return handle.read(size)

    def broken(self):
        spec_field = self.backend.spec_field
        cfg = self.backend.config.model_copy(deep=True)
        spec = getattr(cfg, spec_field)
        if spec_field == "nfs":
            spec.root_path = os.path.join(self.backend.data_root, "missing-mount")
        else:
            spec.mountpoint = os.path.join(spec.mountpoint, "missing-mount")
        return type(self.backend)(cfg)


class S3Harness(Harness):
    def write_uri(self, uri, size):
        _, _, path, _ = split_uri(uri)
        self.backend.client.put_object(Bucket=self.backend.bucket, Key=path[1:], Body=os.urandom(size))

    def read_uri(self, uri, size):
        _, _, path, _ = split_uri(uri)
        return self.backend.client.get_object(Bucket=self.backend.bucket, Key=path[1:])["Body"].read()

    def broken(self):
        cfg = self.backend.config.model_copy(deep=True)
        cfg.s3.bucket = "no-such-bucket"
        return S3Backend(cfg, lambda: boto3.client("s3"))


class MooncakeHarness(Harness):
    def __init__(self, backend, store: FakeMooncakeStore) -> None:
        super().__init__(backend)
        self.store = store

    def write_uri(self, uri, size):
        self.store.put(split_uri(uri)[3]["key"], os.urandom(size))

    def read_uri(self, uri, size):
        return self.store.objects[split_uri(uri)[3]["key"]]

    def broken(self):
        cfg = self.backend.config.model_copy(deep=True)
        cfg.mooncake.master_service_entry = f"127.0.0.1:{free_port()}"
        return MooncakeBackend(cfg, store_factory=lambda: self.store)


class MemPoolHarness(Harness):
    tracks_data = False

    def __init__(self, backend, valkey) -> None:
        super().__init__(backend)
        self.valkey = valkey

    def write_uri(self, uri, size):
        _, _, path, query = split_uri(uri)
        assert int(query["size"]) == size
        assert int(path[1:]) + size <= self.backend.capacity  # engines write at the path's address

    def read_uri(self, uri, size):
        raise AssertionError("the pool's bytes live in the pool service, which these tests do not run")

    def broken(self):
        cfg = self.backend.config.model_copy(deep=True)
        cfg.tair_mem_pool.domain = f"127.0.0.1:{free_port()}"
        return TairMemPoolBackend(cfg, self.valkey)


def storage_config(name: str, field: str, spec: dict) -> StorageConfig:
    return StorageConfig.model_validate({"global_unique_name": name, field: spec})


BACKEND_KINDS = ["nfs-packed", "nfs-unpacked", "3fs", "vcns-3fs", "s3", "mooncake", "mempool"]
