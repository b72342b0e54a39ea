"""Errors of the control plane, all inside the protocol's error family (see protocol.errors)."""

from __future__ import annotations

from ..protocol.errors import InvalidArgumentError, ServiceNotReadyError


class UnknownEntityError(InvalidArgumentError):
    """A storage, instance group or account named in a request does not exist."""


class VersionConflictError(InvalidArgumentError):
    """An optimistic update named a version other than the stored one."""


class EntityInUseError(InvalidArgumentError):
    """The entity cannot be removed while something still refers to it."""


class InstanceRemovingError(ServiceNotReadyError):
    """The instance id is still being removed: registering it again must wait (retryable,
    hence SERVICE_NOT_READY)."""
