"""What each method acts on (``policy.Target``), read from its parsed request.

The instance's group comes from the container's ``ConfigCache`` (no DynamoDB read on a
warm cache); an instance that is not registered has no group, and the call goes on to
answer INSTANCE_NOT_EXIST as it would without auth.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..protocol.errors import InstanceNotFoundError
from .policy import SERVICE, Target


class _Registered(Protocol):
    @property
    def group(self) -> str: ...


class InstanceLookup(Protocol):
    """Where an instance's group is found (``control.ConfigCache``)."""

    def instance(self, instance_id: str) -> _Registered: ...


#: (instances, parsed request) → what the request acts on.
TargetOf = Callable[[InstanceLookup, Any], Target]


def service(instances: InstanceLookup, request: Any) -> Target:
    """Service-wide methods: storages, lists of everything, accounts, metrics, the lease."""
    return SERVICE


def instance(instances: InstanceLookup, request: Any) -> Target:
    """Methods naming an existing instance by ``instance_id``."""
    instance_id = request.instance_id
    if not instance_id:
        return Target()
    try:
        group = instances.instance(instance_id).group
    except InstanceNotFoundError:
        group = None
    return Target(group=group, instance_id=instance_id)


def registration(instances: InstanceLookup, request: Any) -> Target:
    """registerInstance: the group and id the request asks for."""
    return Target(group=request.instance_group or None, instance_id=request.instance_id or None)


def group_name(instances: InstanceLookup, request: Any) -> Target:
    """Methods naming a group in ``name`` (getInstanceGroup, removeInstanceGroup)."""
    return Target(group=request.name or None)


def group_body(instances: InstanceLookup, request: Any) -> Target:
    """createInstanceGroup / updateInstanceGroup: the group in the body."""
    group = request.instance_group
    return Target(group=group.name if group is not None and group.name else None)


def group_listing(instances: InstanceLookup, request: Any) -> Target:
    """listInstanceInfo: one group's instances, or (no group) every instance."""
    return Target(group=request.instance_group_name) if request.instance_group_name else SERVICE
