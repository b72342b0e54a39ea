"""KVCM's one exception family, and the single place that maps it to wire codes.

Layers raise the most specific subclass where a problem is detected (often a subclass
of their own, e.g. ``index.errors.WriteSessionError(InvalidArgumentError)``);
``status_of`` is the only code that turns an exception into an ``ErrorCode``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from .codes import ErrorCode


class KvcmError(Exception):
    """Base of every error KVCM reports on the wire."""


class InvalidArgumentError(KvcmError):
    """The request is malformed or names something that does not exist."""


class MalformedBodyError(KvcmError):
    """The HTTP body is not a JSON object (answered with HTTP 400 ``{}``)."""


class DuplicateEntityError(KvcmError):
    """The entity exists already with a different definition."""


class CapacityExceededError(KvcmError):
    """A quota, key-count cap or instance-count cap would be exceeded."""


class InstanceNotFoundError(KvcmError):
    """The named instance is not registered."""


class ServiceNotReadyError(KvcmError):
    """Valkey or an AWS dependency is unreachable."""


class StorageIOError(KvcmError):
    """A data storage backend failed an I/O operation."""


class UnsupportedError(KvcmError):
    """The operation is not supported in this deployment (e.g. debug service off)."""


class NotLeaderError(KvcmError):
    """The operation needs the background-job lease, which this node does not hold."""


class InjectedFaultError(KvcmError):
    """A fault injected through the debug service."""


class UnauthorizedError(KvcmError):
    """Missing or invalid credentials (HTTP 401)."""


class TooManyAttemptsError(UnauthorizedError):
    """Credentials not even checked: too many failed attempts lately (HTTP 429)."""


class ForbiddenError(KvcmError):
    """Valid credentials without the needed role or scope (HTTP 403)."""


class RequestTooLargeError(InvalidArgumentError):
    """The HTTP body exceeds the configured limit (HTTP 413)."""


_CODES: dict[type[KvcmError], ErrorCode] = {
    InvalidArgumentError: ErrorCode.INVALID_ARGUMENT,
    MalformedBodyError: ErrorCode.INVALID_ARGUMENT,
    DuplicateEntityError: ErrorCode.DUPLICATE_ENTITY,
    CapacityExceededError: ErrorCode.REACH_MAX_ENTITY_CAPACITY,
    InstanceNotFoundError: ErrorCode.INSTANCE_NOT_EXIST,
    ServiceNotReadyError: ErrorCode.SERVICE_NOT_READY,
    StorageIOError: ErrorCode.IO_ERROR,
    UnsupportedError: ErrorCode.UNSUPPORTED,
    NotLeaderError: ErrorCode.SERVER_NOT_LEADER,
    InjectedFaultError: ErrorCode.INTERNAL_ERROR,
    UnauthorizedError: ErrorCode.UNAUTHENTICATED,
    ForbiddenError: ErrorCode.PERMISSION_DENIED,
}

_HTTP_STATUS: dict[type[KvcmError], int] = {
    MalformedBodyError: 400,
    UnauthorizedError: 401,
    TooManyAttemptsError: 429,
    ForbiddenError: 403,
    RequestTooLargeError: 413,
}


V = TypeVar("V")


def _lookup(table: Mapping[type[KvcmError], V], exc: BaseException, default: V) -> V:
    for cls in type(exc).__mro__:
        if issubclass(cls, KvcmError) and cls in table:
            return table[cls]
    return default


def status_of(exc: BaseException) -> tuple[ErrorCode, str]:
    """The wire code and message for any exception (unknown ones are INTERNAL_ERROR)."""
    if isinstance(exc, KvcmError):
        return _lookup(_CODES, exc, ErrorCode.INTERNAL_ERROR), str(exc)
    return ErrorCode.INTERNAL_ERROR, f"internal error: {type(exc).__name__}"


def http_status_of(exc: BaseException) -> int:
    """HTTP status for an error: 200 unless the contract says otherwise."""
    return _lookup(_HTTP_STATUS, exc, 200)
