"""One backend per storage config: validated, built on demand, cached per container.

Usage::

    registry = StorageRegistry(valkey_factory=lambda: valkey_client)
    registry.validate(config)          # addStorage / updateStorage: InvalidArgumentError names the field
    backend = registry.backend(config) # hot path: a dict lookup once built

A backend is cached under its ``global_unique_name`` together with the config's JSON, so
an updated config (updateStorage) gets a fresh backend on its first use and the old one
is dropped.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from ..protocol.models import STORAGE_SPEC_FIELDS, StorageConfig
from ..valkey import Valkey
from .base import StorageBackend
from .checks import config_error
from .event_report import EventReportBackend
from .file import (
    DEFAULT_MIN_FREE_BYTES,
    FileBackend,
    FreeSpaceProbe,
    ThreeFSBackend,
    VcnsThreeFSBackend,
    statvfs_free_space,
)
from .local import LocalBackend
from .mempool import TairMemPoolBackend
from .mooncake import MooncakeBackend
from .s3 import S3Backend, S3ClientFactory

ValkeyFactory = Callable[[], Valkey]

BACKEND_CLASSES: dict[str, type[StorageBackend]] = {
    cls.spec_field: cls
    for cls in (
        FileBackend,
        LocalBackend,
        ThreeFSBackend,
        VcnsThreeFSBackend,
        MooncakeBackend,
        TairMemPoolBackend,
        S3Backend,
        EventReportBackend,
    )
}
# The name is the host of every URI and part of Valkey hash tags: keep it to characters
# that need no escaping anywhere.
_NAME = re.compile(r"[A-Za-z0-9._~-]{1,128}")


def backend_class(config: StorageConfig) -> type[StorageBackend]:
    """The backend class of the storage spec ``config`` sets; InvalidArgumentError when it sets none."""
    field = config.spec_field
    if field is None:
        raise config_error(config, "storage spec", f"is missing: set one of {', '.join(STORAGE_SPEC_FIELDS)}")
    return BACKEND_CLASSES[field]


def sdk_entry(config: StorageConfig, available: bool) -> dict[str, Any]:
    """``config``'s entry in registerInstance's ``storage_configs``, as upstream's engine
    SDK parses it (API.md): its upstream type string and spec field names, in upstream's order."""
    cls = backend_class(config)
    return {
        "type": cls.sdk_type,
        "is_available": available,
        "global_unique_name": config.global_unique_name,
        "storage_spec": cls.sdk_spec(config),
    }


def boto3_s3_client() -> Any:
    """A default boto3 S3 client (honours ``AWS_ENDPOINT_URL`` like any boto3 client)."""
    import boto3

    return boto3.client("s3")


class StorageRegistry:
    """Validates storage configs and hands out their (cached) backends. Thread-safe."""

    def __init__(
        self,
        valkey_factory: ValkeyFactory,
        s3_client_factory: S3ClientFactory = boto3_s3_client,
        key_prefix: str = "kvcm",
        min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
        free_space: FreeSpaceProbe = statvfs_free_space,
    ) -> None:
        """``min_free_bytes`` and ``free_space`` go to the file storages' probes."""
        self._valkey_factory = valkey_factory
        self._min_free_bytes = min_free_bytes
        self._free_space = free_space
        self._s3_client_factory = s3_client_factory
        self._key_prefix = key_prefix
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[str, StorageBackend]] = {}

    def validate(self, config: StorageConfig) -> None:
        """Raise InvalidArgumentError naming the first invalid field of ``config``."""
        if not _NAME.fullmatch(config.global_unique_name):
            raise config_error(config, "global_unique_name", "must be 1-128 characters of A-Z a-z 0-9 . _ ~ -")
        backend_class(config).check_config(config)

    def backend(self, config: StorageConfig) -> StorageBackend:
        """The backend of ``config``, built (after validation) on first use of this version."""
        version = config.model_dump_json()
        name = config.global_unique_name
        with self._lock:
            cached = self._cache.get(name)
            if cached is not None and cached[0] == version:
                return cached[1]
            self.validate(config)
            backend = self._build(config)
            self._cache[name] = (version, backend)
            return backend

    def _build(self, config: StorageConfig) -> StorageBackend:
        cls = backend_class(config)
        if cls is TairMemPoolBackend:
            return TairMemPoolBackend(config, self._valkey_factory(), key_prefix=self._key_prefix)
        if cls is S3Backend:
            return S3Backend(config, client_factory=self._s3_client_factory)
        if issubclass(cls, FileBackend | ThreeFSBackend):
            return cls(config, self._min_free_bytes, self._free_space)
        return cls(config)
