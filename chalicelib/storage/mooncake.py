"""Mooncake storage (``mooncake{local_hostname, metadata_connstring, protocol, rdma_device,
master_service_entry}``).

Keys. One Mooncake object per block per spec, key
``<instance id>_<spec name>_<block key as 16 hex digits>``. Both names are escaped
(``naming.escape_component``) and ``_`` is escaped in the spec name, so the key splits
back unambiguously (key: after the last ``_``, spec: before it, instance: the rest) and
instance ``a_b``/spec ``c`` never shares a key with instance ``a``/spec ``b_c``.
URI: ``mooncake://<global_unique_name>/?key=<url-encoded key>&size=<spec size>``.

Two modes, chosen when the backend is built:

- **client**: the Mooncake Python package is installed (``import mooncake.store`` works)
  or a store factory is injected. The ``MooncakeDistributedStore`` is set up on first use
  from the spec's fields, contributing no memory of its own. ``delete`` removes objects
  (an absent object is fine), ``exists`` asks ``is_exist``.
- **owner-evicted** (``owner_evicted = True``): the package is not importable. Mooncake
  evicts its own data under memory pressure, so KVCM only drops metadata: ``delete`` is
  a no-op, and ``exists`` answers True because KVCM cannot see Mooncake's evictions (an
  evicted object is a read miss for the engine, which is what owner eviction means).
  Callers that need certainty check ``owner_evicted`` first.

Health in both modes: a TCP connect to ``master_service_entry`` (``host:port``, or every
endpoint of ``etcd://a:1;b:2`` until one answers), one second per endpoint.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..protocol.codes import StorageType
from ..protocol.models import MooncakeStorageSpec, StorageConfig
from .base import BlockRef, SpecSlot, StorageBackend, StorageError, UriFormat
from .checks import config_error, require, spec_of
from .naming import HEX64, block_key_args, escape_component, hex64, uri_template
from .net import parse_endpoints, probe_tcp

#: Mooncake's ErrorCode::OBJECT_NOT_FOUND: removing an absent object succeeded already.
OBJECT_NOT_FOUND = -704
PROBE_TIMEOUT_S = 1.0
# KVCM only removes and queries objects: it must not lend memory to the pool, and it
# needs only a small registered buffer.
_SEGMENT_BYTES = 0
_LOCAL_BUFFER_BYTES = 16 * 1024 * 1024


class MooncakeStore(Protocol):
    """The part of ``mooncake.store.MooncakeDistributedStore`` KVCM uses."""

    def setup(
        self,
        local_hostname: str,
        metadata_server: str,
        global_segment_size: int,
        local_buffer_size: int,
        protocol: str,
        rdma_devices: str,
        master_server_address: str,
    ) -> int: ...

    def remove(self, key: str) -> int: ...

    def is_exist(self, key: str) -> int: ...


StoreFactory = Callable[[], MooncakeStore]


def _store_class() -> type | None:
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError:
        return None
    store_class: type = MooncakeDistributedStore
    return store_class


def _open_store(store_class: type, spec: MooncakeStorageSpec) -> MooncakeStore:
    store: MooncakeStore = store_class()
    code = store.setup(
        spec.local_hostname or socket.gethostname(),
        spec.metadata_connstring,
        _SEGMENT_BYTES,
        _LOCAL_BUFFER_BYTES,
        spec.protocol or "tcp",
        spec.rdma_device,
        spec.master_service_entry,
    )
    if code != 0:
        raise StorageError(f"mooncake store setup failed with code {code} (master {spec.master_service_entry})")
    return store


def store_factory_for(spec: MooncakeStorageSpec) -> StoreFactory | None:
    """A factory of set-up Mooncake clients, or None when the package is not installed."""
    store_class = _store_class()
    if store_class is None:
        return None
    return lambda: _open_store(store_class, spec)


class MooncakeBackend(StorageBackend):
    """Blocks as Mooncake objects; see the module docstring for the two modes."""

    storage_type = StorageType.ST_MOONCAKE
    spec_field = "mooncake"
    sdk_type = "mooncake"
    read_weight = 3

    def __init__(self, config: StorageConfig, store_factory: StoreFactory | None = None) -> None:
        self.check_config(config)
        super().__init__(config)
        spec = spec_of(config, self.spec_field)
        self._endpoints = parse_endpoints(spec.master_service_entry)
        self._store_factory = store_factory or store_factory_for(spec)
        self.owner_evicted = self._store_factory is None
        self._store: MooncakeStore | None = None
        self._lock = threading.Lock()

    @classmethod
    def check_config(cls, config: StorageConfig) -> None:
        """Raise InvalidArgumentError naming the first invalid ``mooncake`` field."""
        spec = spec_of(config, cls.spec_field)
        require(config, "mooncake.master_service_entry", spec.master_service_entry)
        try:
            parse_endpoints(spec.master_service_entry)
        except ValueError as exc:
            raise config_error(config, "mooncake.master_service_entry", f"is not usable: {exc}") from None

    @classmethod
    def sdk_spec(cls, config: StorageConfig) -> dict[str, Any]:
        """The spec with upstream's ``master_server_entry`` for ``master_service_entry``."""
        spec: dict[str, Any] = spec_of(config, cls.spec_field).model_dump()
        spec["master_server_entry"] = spec.pop("master_service_entry")
        return spec

    @staticmethod
    def _key_head(instance_id: str, spec_name: str) -> str:
        return f"{escape_component(instance_id)}_{escape_component(spec_name, also='_')}_"

    def key(self, instance_id: str, spec_name: str, block_key: int) -> str:
        """The Mooncake object key of one spec of a block."""
        return self._key_head(instance_id, spec_name) + hex64(block_key)

    def uri_format(self, instance_id: str, spec: SpecSlot) -> UriFormat:
        return UriFormat(
            uri_template(
                self.sdk_type,
                self.name,
                "/",
                (("key", (self._key_head(instance_id, spec.name), HEX64)), ("size", spec.size)),
            ),
            block_key_args,
        )

    def _client(self) -> MooncakeStore:
        # Set up once: a failed setup is not cached, the next call tries again.
        if self._store is None:
            with self._lock:
                if self._store is None:
                    if self._store_factory is None:  # owner-evicted mode never gets here
                        raise StorageError(f"storage {self.name}: the mooncake package is not installed")
                    self._store = self._store_factory()
        return self._store

    def _call(self, method: str, key: str) -> int:
        try:
            return int(getattr(self._client(), method)(key))
        except StorageError:
            raise
        except Exception as exc:  # a native client raises anything; report it as storage I/O
            raise StorageError(f"storage {self.name}: mooncake {method}({key!r}) raised {exc!r}") from exc

    def delete(self, blocks: Sequence[BlockRef]) -> None:
        """Remove every spec object (client mode); owner-evicted: nothing to do."""
        if self.owner_evicted:
            return
        failures: list[str] = []
        for block in blocks:
            for spec in block.specs:
                key = self.key(block.instance_id, spec.name, block.block_key)
                code = self._call("remove", key)
                if code not in (0, OBJECT_NOT_FOUND):
                    failures.append(f"{key}: code {code}")
        if failures:
            raise StorageError(
                f"storage {self.name}: mooncake remove failed for {len(failures)} object(s): {'; '.join(failures[:3])}"
            )

    def exists(self, block: BlockRef) -> bool:
        """Every spec object exists (client mode); owner-evicted: True, see the module doc."""
        if self.owner_evicted:
            return True
        for spec in block.specs:
            key = self.key(block.instance_id, spec.name, block.block_key)
            code = self._call("is_exist", key)
            if code == 0:
                return False
            if code != 1:
                raise StorageError(f"storage {self.name}: mooncake is_exist({key!r}) failed with code {code}")
        return True

    def probe(self) -> None:
        """TCP connect to the master service entry (any endpoint)."""
        probe_tcp(self.name, self._endpoints, PROBE_TIMEOUT_S)
