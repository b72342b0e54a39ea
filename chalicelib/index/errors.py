"""The index's errors (all in the protocol's exception family)."""
import re
from contextlib import contextmanager
from typing import Iterator

import redis
from redis.exceptions import ClusterError, ReadOnlyError, RedisClusterException, TryAgainError

from ..protocol.errors import CapacityExceededError, InstanceNotFoundError, InvalidArgumentError, ServiceNotReadyError


class IndexUnavailableError(ServiceNotReadyError):
    """Valkey did not answer."""


# Valkey cannot serve now, as opposed to "the request is wrong": no connection or a
# timeout, a cluster failing over or re-sharding, a replica answering a write.
_UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, ClusterError, TryAgainError, ReadOnlyError)
# Another client's script still running; redis-py prefixes a pipeline's errors.
_BUSY = re.compile(r"(^|caused error: )BUSY\b")


@contextmanager
def valkey_errors(what: str) -> Iterator[None]:
    """Turn "Valkey cannot serve now" into IndexUnavailableError (SERVICE_NOT_READY on the
    wire), so an outage reads as "retry later", never as an internal error."""
    try:
        yield
    except _UNAVAILABLE as exc:
        raise IndexUnavailableError(f"{what} unavailable: {exc}") from None
    except redis.ResponseError as exc:
        if not _BUSY.search(str(exc)):
            raise
        raise IndexUnavailableError(f"{what} unavailable: {exc}") from None
    except RedisClusterException as exc:
        # Raised for no reachable node, but also for a request spanning slots (a bug).
        if "cannot be connected" not in str(exc):
            raise
        raise IndexUnavailableError(f"{what} unavailable: {exc}") from None


class InstanceGoneError(InstanceNotFoundError):
    """The instance is being removed, or was registered again since the caller read it."""


class StaleInstanceError(InstanceGoneError):
    """Another registration (incarnation) of the instance owns its key space."""


class QuotaExceededError(CapacityExceededError):
    """A start would exceed the group quota (kind ``group``), a storage type's quota
    (``type``) or the instance's key-count cap (``keys``)."""

    def __init__(self, kind: str, message: str, shortfall: int = 0, storage_type: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        #: How much is missing: bytes for ``group`` and ``type``, blocks for ``keys``.
        self.shortfall = shortfall
        #: The storage type the start wrote to (the one whose quota a ``type`` refusal names).
        self.storage_type = storage_type


class WriteSessionError(InvalidArgumentError):
    """A finish named a session that is unknown, finished, expired or another instance's."""
