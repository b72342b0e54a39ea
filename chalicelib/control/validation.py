"""Request validation shared by the admin and meta routes; every message names the field.

Field paths use the wire's snake_case names, e.g. ``instance_group.quota.capacity``.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from ..protocol.errors import InvalidArgumentError
from ..protocol.models import STORAGE_SPEC_FIELDS, RegisterInstanceRequest, StorageConfig

#: DynamoDB sort keys are at most 1024 bytes; names stay well below that.
MAX_NAME_LENGTH = 256
MAX_PASSWORD_LENGTH = 1024


def invalid(path: str, problem: str) -> InvalidArgumentError:
    """The error for one bad field."""
    return InvalidArgumentError(f"field '{path}' {problem}")


def require(value: Any, path: str) -> None:
    """Fail unless ``value`` is set (not None, not empty)."""
    if value is None or value == "" or value == []:
        raise invalid(path, "is required")


def require_name(value: str, path: str) -> str:
    """A required name: non-empty, bounded, printable."""
    require(value, path)
    if len(value) > MAX_NAME_LENGTH:
        raise invalid(path, f"is longer than {MAX_NAME_LENGTH} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise invalid(path, "must not contain control characters")
    return value


def require_positive(value: int, path: str) -> None:
    if value <= 0:
        raise invalid(path, f"must be > 0, got {value}")


def require_non_negative(value: int, path: str) -> None:
    if value < 0:
        raise invalid(path, f"must be >= 0, got {value}")


def require_unique(names: Iterable[str], path: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise invalid(f"{path}[{i}]", f"repeats the name {name!r}")
        seen.add(name)


def validate_storage_config(config: Optional[StorageConfig], path: str = "storage") -> StorageConfig:
    """The generic checks of a storage config (name, exactly one spec); backend-specific
    checks belong to the storage registry."""
    if config is None:
        raise invalid(path, "is required")
    require_name(config.global_unique_name, f"{path}.global_unique_name")
    if config.spec_field is None:
        raise invalid(path, f"must set one of {', '.join(STORAGE_SPEC_FIELDS)}")
    return config


def validate_register_request(request: RegisterInstanceRequest) -> None:
    """The rules of MetaService.registerInstance (API.md): raises InvalidArgumentError."""
    require_name(request.instance_group, "instance_group")
    require_name(request.instance_id, "instance_id")
    require_positive(request.block_size, "block_size")
    if not request.location_spec_infos:
        raise invalid("location_spec_infos", "needs at least one entry")
    for i, spec in enumerate(request.location_spec_infos):
        require_name(spec.name, f"location_spec_infos[{i}].name")
        require_positive(spec.size, f"location_spec_infos[{i}].size")
    require_unique((s.name for s in request.location_spec_infos), "location_spec_infos")
    deployment = request.model_deployment
    if deployment is None:
        raise invalid("model_deployment", "is required")
    require(deployment.model_name, "model_deployment.model_name")
    require(deployment.dtype, "model_deployment.dtype")
    for name in ("tp_size", "dp_size", "pp_size"):
        require_non_negative(getattr(deployment, name), f"model_deployment.{name}")
    spec_names = {s.name for s in request.location_spec_infos}
    for i, group in enumerate(request.location_spec_groups):
        require_name(group.name, f"location_spec_groups[{i}].name")
        if not group.spec_names:
            raise invalid(f"location_spec_groups[{i}].spec_names", "needs at least one spec name")
        for j, spec_name in enumerate(group.spec_names):
            if spec_name not in spec_names:
                raise invalid(f"location_spec_groups[{i}].spec_names[{j}]",
                              f"names unknown spec {spec_name!r} (not in location_spec_infos)")
        require_unique(group.spec_names, f"location_spec_groups[{i}].spec_names")
    require_unique((g.name for g in request.location_spec_groups), "location_spec_groups")


def validate_credentials(user_name: str, password: str) -> None:
    """An account's user name and password as addAccount accepts them."""
    require_name(user_name, "user_name")
    # The bearer token is "<user_name>:<password>", split at the first colon.
    if ":" in user_name:
        raise invalid("user_name", "must not contain ':'")
    require(password, "password")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise invalid("password", f"is longer than {MAX_PASSWORD_LENGTH} characters")
