"""The configuration a fresh local stack starts with, like upstream's startup config:
one file-backed storage and one instance group using it.

It goes through ``ControlPlane`` like an admin call would (same validation, same
records) and only adds what is absent, so changes made to them survive restarts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from chalicelib.protocol.errors import DuplicateEntityError
from chalicelib.protocol.models import InstanceGroup, InstanceGroupQuota, NfsStorageSpec, StorageConfig
from chalicelib.settings import Settings

STORAGE_NAME = "nfs_01"
GROUP_NAME = "default"
GROUP_QUOTA_BYTES = 100 * 1024**3
KEY_COUNT_PER_FILE = 8


def storage_root(data_dir: Path) -> Path:
    """Where the default storage keeps its files: in the stack's state folder."""
    return (data_dir / STORAGE_NAME).resolve()


def default_storage(data_dir: Path) -> StorageConfig:
    """``nfs_01``: the file backend rooted in the stack's state folder."""
    return StorageConfig(
        global_unique_name=STORAGE_NAME,
        nfs=NfsStorageSpec(root_path=str(storage_root(data_dir)), key_count_per_file=KEY_COUNT_PER_FILE),
    )


def default_group(max_instances: int) -> InstanceGroup:
    """``default``: writes to ``nfs_01``, 100 GiB quota, at most ``max_instances``
    instances (``KVCM_DEFAULT_GROUP_MAX_INSTANCES``; registration checks it in the
    transaction that counts the instance), every other setting defaulted."""
    return InstanceGroup(
        name=GROUP_NAME,
        storage_candidates=[STORAGE_NAME],
        quota=InstanceGroupQuota(capacity=GROUP_QUOTA_BYTES),
        max_instance_count=max_instances,
    )


def _add_absent(add: Callable[[Any], Any], entity: Any) -> bool:
    try:
        add(entity)
        return True
    except DuplicateEntityError:
        return False


def seed_defaults(control: Any, data_dir: Path, max_instances: int = Settings.default_group_max_instances) -> list[str]:
    """Add the default storage and group (of at most ``max_instances`` instances) unless
    they exist; returns the names added."""
    storage = default_storage(data_dir)
    storage_root(data_dir).mkdir(parents=True, exist_ok=True)
    added = []
    if _add_absent(control.add_storage, storage):
        added.append(STORAGE_NAME)
    if _add_absent(control.create_group, default_group(max_instances)):
        added.append(GROUP_NAME)
    return added
