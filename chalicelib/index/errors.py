"""The index's errors (all in the protocol's exception family)."""
from contextlib import contextmanager
from typing import Iterator

import redis

from ..protocol.errors import CapacityExceededError, InvalidArgumentError, ServiceNotReadyError


class IndexUnavailableError(ServiceNotReadyError):
    """Valkey did not answer."""


@contextmanager
def valkey_errors(what: str) -> Iterator[None]:
    """Turn "Valkey did not answer" into IndexUnavailableError (SERVICE_NOT_READY on the
    wire), so an outage reads as "retry later", never as an internal error."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise IndexUnavailableError(f"{what} unavailable: {exc}") from None


class QuotaExceededError(CapacityExceededError):
    """A start would exceed the group quota (kind ``group``), a storage type's quota
    (``type``) or the instance's key-count cap (``keys``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class WriteSessionError(InvalidArgumentError):
    """A finish named a session that is unknown, finished, expired or another instance's."""
