"""getInstanceGroupUsage (KVCM addition): how full each instance group is, against its quota
and its watermark, with its instances' shares — what ``kvcm usage`` and the console show.

Usage comes from the index's counters (one round trip per group, like the reclaimer's look);
limits from the group's config with the reclaimer's defaults (``watermark.Limits``), so the
watermark shown is the one reclaim really starts at.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from ..cache.contexts import ContextProvider
from ..control import ControlPlane
from ..index import BlockIndex, Usage
from ..observability.metrics import MetricsRegistry
from ..protocol.codes import StorageType
from ..protocol.errors import InstanceNotFoundError
from ..protocol.models import (
    GetInstanceGroupUsageRequest,
    GetInstanceGroupUsageResponse,
    InstanceGroup,
    InstanceGroupUsage,
    InstanceUsage,
    StorageTypeUsage,
    StorageUsage,
)
from .watermark import Limits


def _watermark(limits: Limits) -> int:
    triggers = ([limits.trigger(limits.capacity)] if limits.capacity > 0 else []) + (
        [limits.used_size] if limits.used_size > 0 else []
    )
    return min(triggers, default=0)


def group_usage(
    group: InstanceGroup, usages: dict[str, Usage], storage_types: Mapping[str, StorageType]
) -> InstanceGroupUsage:
    """The report of one group whose instances use ``usages`` (by instance id);
    ``storage_types`` gives each storage's type by name."""
    limits = Limits.of(group)
    types = sorted(set(limits.type_capacity) | {t for u in usages.values() for t in u.by_type})
    by_type = [
        StorageTypeUsage(
            storage_type=StorageType.__members__.get(name, StorageType.ST_UNSPECIFIED),
            used_bytes=sum(u.by_type.get(name, 0) for u in usages.values()),
            capacity=limits.type_capacity.get(name, 0),
            watermark_bytes=(limits.trigger(limits.type_capacity[name]) if name in limits.type_capacity else 0),
        )
        for name in types
    ]
    storages = sorted(set(group.storage_candidates) | {name for u in usages.values() for name in u.by_storage})
    by_storage = [
        StorageUsage(
            storage_name=name,
            storage_type=storage_types.get(name, StorageType.ST_UNSPECIFIED),
            used_bytes=sum(u.by_storage.get(name, 0) for u in usages.values()),
        )
        for name in storages
    ]
    instances = sorted(
        (InstanceUsage(instance_id=i, used_bytes=u.bytes, key_count=u.keys) for i, u in usages.items()),
        key=lambda usage: (-usage.used_bytes, usage.instance_id),
    )
    return InstanceGroupUsage(
        name=group.name,
        capacity=limits.capacity,
        watermark_bytes=_watermark(limits),
        used_bytes=sum(u.bytes for u in usages.values()),
        key_count=sum(u.keys for u in usages.values()),
        max_key_count=limits.max_keys,
        by_storage_type=by_type,
        by_storage=by_storage,
        instances=instances,
    )


def record_usage_gauges(metrics: MetricsRegistry, group: InstanceGroupUsage) -> None:
    """Set a group's usage gauges (UPSTREAM_V2 §2.16): ``cache_manager_group.usage_ratio``
    (with a quota) and each instance's ``cache_manager_instance.key_count`` and ``.byte_size``;
    per tier (KVCM): ``cache_manager_group.storage_type_byte_size{storage_type}``,
    ``.storage_type_usage_ratio{storage_type}`` (with a type quota: what tiered Copy's
    ``trigger_threshold`` is compared with) and ``.storage_byte_size{storage}``."""
    group_tags = {"instance_group": group.name}
    if group.capacity > 0:
        metrics.gauge("cache_manager_group.usage_ratio", group.used_bytes / group.capacity, group_tags)
    for tier in group.by_storage_type:
        tags = group_tags | {"storage_type": tier.storage_type.name}
        metrics.gauge("cache_manager_group.storage_type_byte_size", tier.used_bytes, tags)
        if tier.capacity > 0:
            metrics.gauge("cache_manager_group.storage_type_usage_ratio", tier.used_bytes / tier.capacity, tags)
    for storage in group.by_storage:
        tags = group_tags | {"storage": storage.storage_name}
        metrics.gauge("cache_manager_group.storage_byte_size", storage.used_bytes, tags)
    for instance in group.instances:
        tags = {"instance_group": group.name, "instance_id": instance.instance_id}
        metrics.gauge("cache_manager_instance.key_count", instance.key_count, tags)
        metrics.gauge("cache_manager_instance.byte_size", instance.used_bytes, tags)


class UsageReports:
    """getInstanceGroupUsage over the control plane's listings and the index's counters."""

    def __init__(self, control: ControlPlane, contexts: ContextProvider, index: BlockIndex) -> None:
        self.control = control
        self.contexts = contexts
        self.index = index

    def get_instance_group_usage(self, request: GetInstanceGroupUsageRequest) -> GetInstanceGroupUsageResponse:
        """Usage of one group (``instance_group_name``) or of every group; unknown group → INVALID_ARGUMENT."""
        name = request.instance_group_name
        groups = [self.control.get_group(name)] if name else self.control.list_groups()
        ids: dict[str, list[str]] = defaultdict(list)
        for record in self.control.list_instances(name):
            ids[record.group].append(record.instance_id)
        storage_types = {record.name: record.config.storage_type for record in self.control.list_storages()}
        reports = []
        for group in groups:
            contexts = []
            for instance_id in ids[group.name]:
                try:
                    contexts.append(self.contexts(instance_id))
                except InstanceNotFoundError:
                    continue  # removed since the listing
            usages = self.index.usage([c.layout for c in contexts]) if contexts else []
            reports.append(
                group_usage(group, {c.instance_id: u for c, u in zip(contexts, usages, strict=True)}, storage_types)
            )
        return GetInstanceGroupUsageResponse(usage=reports)
