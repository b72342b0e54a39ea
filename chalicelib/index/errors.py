"""The index's errors (all in the protocol's exception family)."""
from ..protocol.errors import CapacityExceededError, InvalidArgumentError, ServiceNotReadyError


class IndexUnavailableError(ServiceNotReadyError):
    """Valkey did not answer."""


class QuotaExceededError(CapacityExceededError):
    """A start would exceed the group quota (kind ``group``), a storage type's quota
    (``type``) or the instance's key-count cap (``keys``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class WriteSessionError(InvalidArgumentError):
    """A finish named a session that is unknown, finished, expired or another instance's."""
