"""The ``usage_metrics`` schedule: UPSTREAM_V2 §2.16's interval gauges of how full the cache
is, from the index's usage counters (the figures getInstanceGroupUsage reports):
``cache_manager_group.usage_ratio{instance_group}``, ``cache_manager_instance.key_count`` and
``.byte_size{instance_group, instance_id}``, ``meta_indexer.total_key_count`` and
``.total_cache_usage``. Engine-reported blocks are metadata only and not counted, as upstream."""

from __future__ import annotations

from ..capacity.usage import UsageReports
from ..observability.metrics import MetricsRegistry
from ..protocol.models import GetInstanceGroupUsageRequest
from ..stores.lease import Lease


class UsageMetrics:
    """Publishes the usage gauges once per run (the lease holder only)."""

    def __init__(self, lease: Lease, usage: UsageReports, metrics: MetricsRegistry) -> None:
        self.lease = lease
        self.usage = usage
        self.metrics = metrics

    def run(self) -> dict[str, int | str]:
        """Set every gauge; returns how many groups and instances were measured."""
        if not self.lease.try_acquire():
            return {"skipped": "lease held by another node"}
        groups = self.usage.get_instance_group_usage(GetInstanceGroupUsageRequest()).usage
        keys = used = instances = 0
        for group in groups:
            if group.capacity > 0:
                self.metrics.gauge(
                    "cache_manager_group.usage_ratio", group.used_bytes / group.capacity, {"instance_group": group.name}
                )
            for instance in group.instances:
                tags = {"instance_group": group.name, "instance_id": instance.instance_id}
                self.metrics.gauge("cache_manager_instance.key_count", instance.key_count, tags)
                self.metrics.gauge("cache_manager_instance.byte_size", instance.used_bytes, tags)
                instances += 1
            keys += group.key_count
            used += group.used_bytes
        self.metrics.gauge("meta_indexer.total_key_count", keys)
        self.metrics.gauge("meta_indexer.total_cache_usage", used)
        return {"groups": len(groups), "instances": instances}
