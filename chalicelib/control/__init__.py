"""The DynamoDB control plane: storages, instance groups, instances, accounts.

``ControlPlane`` reads and writes them (admin and registration paths); ``ConfigCache``
serves them to the hot path without per-call DynamoDB reads; ``admin`` holds the
AdminService handlers.
"""

from .config_cache import ConfigCache
from .errors import EntityInUseError, UnknownEntityError, VersionConflictError
from .plane import ControlPlane
from .records import InstanceRecord, StorageRecord
from .table import ensure_table, table_definition
from .validation import validate_register_request
from .views import storage_configs_json

__all__ = [
    "ConfigCache",
    "ControlPlane",
    "EntityInUseError",
    "InstanceRecord",
    "StorageRecord",
    "UnknownEntityError",
    "VersionConflictError",
    "ensure_table",
    "storage_configs_json",
    "table_definition",
    "validate_register_request",
]
