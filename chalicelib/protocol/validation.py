"""Field checks shared by every layer that reads a request: the dispatcher (names that enter
Valkey keys), the services and the control plane. Every message names the field, in the
wire's snake_case path, e.g. ``instance_group.quota.capacity``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import Any

from .errors import InvalidArgumentError
from .models import STORAGE_SPEC_FIELDS, FinishWriteCacheRequest, StorageConfig

#: DynamoDB sort keys are at most 1024 bytes; names stay well below that.
MAX_NAME_LENGTH = 256
#: Names that become part of Valkey keys (instance ids, instance group and storage names):
#: printable characters but for '{' and '}' (a '}' would end the cluster hash tag and put
#: the key into another instance's key space), no whitespace. Storage paths escape names
#: on their own (storage.naming), so '/', '%' or non-ASCII letters stay allowed.
KEY_NAME_RULE = "1 to 128 characters, none of them '{', '}', whitespace, a control, invisible or bidi character"
_KEY_NAME = re.compile(r"[^\s{}\x00-\x1f\x7f-\x9f]{1,128}")
#: Invisible or reordering characters (format: U+200B, U+202E bidi override, U+FEFF,
#: U+00AD soft hyphen, U+2060; line/paragraph separators; private use): a name holding
#: one looks like another name to whoever reads it (audit log, console, listings).
REFUSED_CATEGORIES = frozenset({"Cf", "Zl", "Zp", "Co"})
#: Write session ids are made by the server (``cache.service.new_session_id``).
_SESSION_ID = re.compile(r"[a-z0-9]{32}")


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
    _refuse_invisible(value, path)
    return value


def _refuse_invisible(value: str, path: str) -> None:
    for c in value:
        if unicodedata.category(c) in REFUSED_CATEGORIES:
            raise invalid(path, f"must not contain invisible or bidi characters (U+{ord(c):04X})")


def require_key_name(value: str, path: str) -> str:
    """A required name that enters Valkey keys (``KEY_NAME_RULE``)."""
    require(value, path)
    if not _KEY_NAME.fullmatch(value):
        raise invalid(path, f"must be {KEY_NAME_RULE}")
    _refuse_invisible(value, path)
    return value


def validate_key_fields(request: Any) -> None:
    """Check the request fields that name Valkey keys before any key is built: a set
    ``instance_id`` or instance group name must be a key name, a finishWriteCache
    ``write_session_id`` a session id."""
    for path in ("instance_id", "instance_group", "instance_group_name"):
        value = getattr(request, path, "")
        if value and isinstance(value, str):  # createInstanceGroup's instance_group is the group itself
            require_key_name(value, path)
    if (
        isinstance(request, FinishWriteCacheRequest)
        and request.write_session_id
        and not _SESSION_ID.fullmatch(request.write_session_id)
    ):
        raise invalid("write_session_id", "is not a write session id (32 characters of a-z, 0-9)")


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


def validate_storage_config(config: StorageConfig | None, path: str = "storage") -> StorageConfig:
    """The generic checks of a storage config (name, exactly one spec); backend-specific
    checks belong to the storage registry."""
    if config is None:
        raise invalid(path, "is required")
    require_key_name(config.global_unique_name, f"{path}.global_unique_name")
    if config.spec_field is None:
        raise invalid(path, f"must set one of {', '.join(STORAGE_SPEC_FIELDS)}")
    return config
