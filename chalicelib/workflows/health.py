"""Scheduled storage health checks: probe every storage, flip availability with
hysteresis, publish ``data_storage.healthy_status``.

An unhealthy storage gets no writes (starts fail over to the next candidate) and serves
no reads, from the next context refresh of each container on (``config_refresh_s``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..clock import Clock
from ..control import ControlPlane
from ..observability.logging import logger
from ..observability.metrics import MetricsRegistry
from ..storage import StorageRegistry
from ..storage.health import AvailabilityTracker, probe_storage
from ..stores.lease import Lease
from ..stores.storage_health import StorageHealthStore

PROBE_TIMEOUT_S = 5.0
FAIL_THRESHOLD = 2
RECOVER_THRESHOLD = 2


class HealthChecks:
    """The ``health_check`` schedule's work."""

    def __init__(
        self,
        lease: Lease,
        control: ControlPlane,
        storages: StorageRegistry,
        store: StorageHealthStore,
        metrics: MetricsRegistry,
        clock: Clock,
    ) -> None:
        self.lease = lease
        self.control = control
        self.storages = storages
        self.store = store
        self.metrics = metrics
        self.clock = clock

    def run_health_checks(self) -> dict[str, Any]:
        """Probe every storage once (the lease holder only); returns what changed."""
        if not self.lease.try_acquire():
            return {"skipped": "lease held by another node"}
        records = self.control.list_storages()
        tracker = AvailabilityTracker(FAIL_THRESHOLD, RECOVER_THRESHOLD, clock=self.clock)
        saved = self.store.load()
        for name, state in saved.items():
            tracker.restore(name, state)
        backends = [self.storages.backend(r.config) for r in records]
        with ThreadPoolExecutor(max_workers=min(8, max(1, len(backends)))) as pool:
            results = list(pool.map(lambda b: probe_storage(b, PROBE_TIMEOUT_S), backends))
        changes = []
        for backend, result in zip(backends, results, strict=True):
            change = tracker.observe(backend.name, result)
            if change is not None:
                changes.append({"storage": change.storage, "available": change.available, "reason": change.reason})
                logger.warning("storage availability changed", extra=changes[-1])
            self.metrics.gauge(
                "data_storage.healthy_status", int(tracker.is_available(backend.name)), {"storage": backend.name}
            )
        names = {b.name for b in backends}
        self.metrics.gauge("data_storage.last_health_round_time_s", self.clock.now())
        self.store.save({name: tracker.status(name) for name in names})
        self.store.forget(set(saved) - names)
        return {
            "probed": len(backends),
            "changes": changes,
            "unavailable": sorted(n for n in names if not tracker.is_available(n)),
        }
