"""The block index's errors (all in the protocol's exception family)."""

from ..protocol.errors import CapacityExceededError, InstanceNotFoundError, InvalidArgumentError
from .layout import StartRefusal


class InstanceGoneError(InstanceNotFoundError):
    """The instance is being removed, or was registered again since the caller read it."""


class StaleInstanceError(InstanceGoneError):
    """Another registration (incarnation) of the instance owns its key space."""


class QuotaExceededError(CapacityExceededError):
    """A start refused by lua/start.lua (``kind``): the instance's own quota, the group
    quota, a storage type's quota, the key-count cap, the storage count or the open
    sessions cap."""

    def __init__(self, kind: StartRefusal, message: str, shortfall: int = 0, storage_type: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        #: How much is missing: bytes for ``instance``, ``group`` and ``type``, blocks for ``keys``.
        self.shortfall = shortfall
        #: The storage type the start wrote to (the one whose quota a ``type`` refusal names).
        self.storage_type = storage_type


class WriteSessionError(InvalidArgumentError):
    """A finish named a session that is unknown, finished, expired or another instance's."""


class CopyGuardError(WriteSessionError):
    """A quarantined Copy's session was to be closed without its guard state (a finish, the
    reaper's expiry), or a release named another guard state (docs/tiered-storage.md
    "Copy quarantine")."""
