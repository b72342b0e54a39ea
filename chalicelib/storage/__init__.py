"""Data storage backends: URIs for the engines, data deletion, health probes, and the
byte copy between tiers (``copy.copy_blocks``).

``base.StorageBackend`` is the port; ``StorageRegistry`` builds the backend of a
``StorageConfig``; ``health`` probes backends and tracks their availability, which
``health_store`` shares between containers in Valkey (every piece of storage health here).
"""

from .base import (
    BlockRef,
    SpecSlot,
    StorageBackend,
    StorageCopyUnsupportedError,
    StorageError,
    StorageUnavailableError,
)
from .copy import copy_blocks
from .file import FileBackend, ThreeFSBackend, VcnsThreeFSBackend
from .health import AvailabilityChange, AvailabilityTracker, ProbeResult, StorageHealth, probe_storage
from .mempool import PoolExhaustedError, PoolSnapshot, TairMemPoolBackend
from .mooncake import MooncakeBackend, MooncakeStore
from .registry import BACKEND_CLASSES, StorageRegistry, boto3_s3_client
from .s3 import S3Backend

__all__ = [
    "AvailabilityChange",
    "AvailabilityTracker",
    "BACKEND_CLASSES",
    "BlockRef",
    "FileBackend",
    "MooncakeBackend",
    "MooncakeStore",
    "PoolExhaustedError",
    "PoolSnapshot",
    "ProbeResult",
    "S3Backend",
    "SpecSlot",
    "StorageBackend",
    "StorageCopyUnsupportedError",
    "StorageError",
    "StorageHealth",
    "StorageRegistry",
    "StorageUnavailableError",
    "TairMemPoolBackend",
    "ThreeFSBackend",
    "VcnsThreeFSBackend",
    "boto3_s3_client",
    "copy_blocks",
    "probe_storage",
]
