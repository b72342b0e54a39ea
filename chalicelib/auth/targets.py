"""What each method acts on (``policy.Target``), read from its parsed request.

The instance's group comes from the container's ``ConfigCache`` (no DynamoDB read on a
warm cache); an instance that is not registered has no group, and the call goes on to
answer INSTANCE_NOT_EXIST as it would without auth.
"""
from __future__ import annotations

from typing import Any, Callable

from ..protocol.errors import InstanceNotFoundError
from .policy import SERVICE, Target

TargetOf = Callable[[Any, Any], Target]


def service(runtime, request) -> Target:
    """Service-wide methods: storages, lists of everything, accounts, metrics, the lease."""
    return SERVICE


def instance(runtime, request) -> Target:
    """Methods naming an existing instance by ``instance_id``."""
    instance_id = request.instance_id
    if not instance_id:
        return Target()
    try:
        group = runtime.config.instance(instance_id).group
    except InstanceNotFoundError:
        group = None
    return Target(group=group, instance_id=instance_id)


def registration(runtime, request) -> Target:
    """registerInstance: the group and id the request asks for."""
    return Target(group=request.instance_group or None, instance_id=request.instance_id or None)


def group_name(runtime, request) -> Target:
    """Methods naming a group in ``name`` (getInstanceGroup, removeInstanceGroup)."""
    return Target(group=request.name or None)


def group_body(runtime, request) -> Target:
    """createInstanceGroup / updateInstanceGroup: the group in the body."""
    group = request.instance_group
    return Target(group=group.name if group is not None and group.name else None)


def group_listing(runtime, request) -> Target:
    """listInstanceInfo: one group's instances, or (no group) every instance."""
    return Target(group=request.instance_group_name) if request.instance_group_name else SERVICE
