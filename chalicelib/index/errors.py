"""The index's errors (all in the protocol's exception family)."""
from ..protocol.errors import CapacityExceededError, InvalidArgumentError, ServiceNotReadyError


class IndexUnavailableError(ServiceNotReadyError):
    """Valkey did not answer."""


class QuotaExceededError(CapacityExceededError):
    """A start would exceed the group quota, a type quota or the key-count cap."""


class WriteSessionError(InvalidArgumentError):
    """A finish named a session that is unknown, finished, expired or another instance's."""
