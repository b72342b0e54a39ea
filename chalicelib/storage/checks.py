"""Config checks shared by the backends: every failure names the offending field."""

from __future__ import annotations

from typing import Any

from ..protocol.errors import InvalidArgumentError
from ..protocol.models import StorageConfig


def config_error(config: StorageConfig, field: str, problem: str) -> InvalidArgumentError:
    """An InvalidArgumentError such as ``storage 'nfs_01': nfs.root_path must not be empty``."""
    return InvalidArgumentError(f"storage {config.global_unique_name!r}: {field} {problem}")


def require(config: StorageConfig, field: str, value: str) -> None:
    """``value`` (the content of ``field``) must not be blank."""
    if not value.strip():
        raise config_error(config, field, "must not be empty")


def require_absolute(config: StorageConfig, field: str, value: str) -> None:
    """``value`` must be an absolute path without ``..`` components."""
    require(config, field, value)
    if not value.startswith("/"):
        raise config_error(config, field, f"must be an absolute path, got {value!r}")
    require_contained(config, field, value)


def require_contained(config: StorageConfig, field: str, value: str) -> None:
    """``value`` must not climb out of where it is joined (no ``..`` component, no NUL)."""
    if "\0" in value or ".." in value.split("/"):
        raise config_error(config, field, f"must not contain '..' or NUL, got {value!r}")


def require_non_negative(config: StorageConfig, field: str, value: int) -> None:
    """``value`` must be ≥ 0."""
    if value < 0:
        raise config_error(config, field, f"must be >= 0, got {value}")


def spec_of(config: StorageConfig, field: str) -> Any:
    """The ``field`` member of the config's storage-spec oneof; it must be the one set."""
    spec = getattr(config, field)
    if spec is None:
        raise config_error(config, field, f"is not set (the config has {config.spec_field or 'no storage spec'})")
    return spec
