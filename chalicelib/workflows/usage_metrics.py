"""The ``usage_metrics`` schedule: UPSTREAM_V2 §2.16's interval gauges of how full the cache
is, from the index's usage counters (the figures getInstanceGroupUsage reports):
``cache_manager_group.usage_ratio{instance_group}``, ``cache_manager_instance.key_count`` and
``.byte_size{instance_group, instance_id}``, ``meta_indexer.total_key_count`` and
``.total_cache_usage``. Engine-reported blocks are metadata only and not counted, as upstream.
Besides: ``valkey.used_memory_bytes`` and ``valkey.maxmemory_bytes`` (0: no limit), what the
block index really costs in Valkey (a deployed stack's alarm watches ElastiCache's own metric)."""

from __future__ import annotations

from collections.abc import Callable

from ..capacity.usage import UsageReports, record_usage_gauges
from ..observability.metrics import MetricsRegistry
from ..protocol.models import GetInstanceGroupUsageRequest
from ..stores.lease import Lease


class UsageMetrics:
    """Publishes the usage gauges once per run (the lease holder only)."""

    def __init__(
        self,
        lease: Lease,
        usage: UsageReports,
        metrics: MetricsRegistry,
        valkey_memory: Callable[[], tuple[int, int]],
    ) -> None:
        self.lease = lease
        self.usage = usage
        self.metrics = metrics
        self.valkey_memory = valkey_memory

    def run(self) -> dict[str, int | str]:
        """Set every gauge; returns how many groups and instances were measured."""
        if not self.lease.try_acquire():
            return {"skipped": "lease held by another node"}
        groups = self.usage.get_instance_group_usage(GetInstanceGroupUsageRequest()).usage
        keys = used = instances = 0
        for group in groups:
            record_usage_gauges(self.metrics, group)
            instances += len(group.instances)
            keys += group.key_count
            used += group.used_bytes
        self.metrics.gauge("meta_indexer.total_key_count", keys)
        self.metrics.gauge("meta_indexer.total_cache_usage", used)
        memory_used, memory_limit = self.valkey_memory()
        self.metrics.gauge("valkey.used_memory_bytes", memory_used)
        self.metrics.gauge("valkey.maxmemory_bytes", memory_limit)
        return {"groups": len(groups), "instances": instances}
