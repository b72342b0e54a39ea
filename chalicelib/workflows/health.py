"""Storage health checks: probe storages, flip availability with hysteresis, publish
``data_storage.healthy_status``.

An unavailable storage gets no writes (starts fail over to the next candidate) and serves
no reads; a full one serves reads and gets no writes; both from the next context refresh
of each container on (``config_refresh_s``), at once in the container that saw the change.

Two ways in:

- the ``health_check`` schedule probes every storage once a minute (the lease holder
  only). A storage whose probe disagrees with its state is probed again
  ``CONFIRM_DELAY_S`` later in the same round, until the hysteresis threshold is reached
  or the probes agree again: a change takes one round, not ``FAIL_THRESHOLD`` rounds;
- a read or write refused for want of a storage (``StorageReprobe``) probes the instance's
  storages at once, at most once per ``REPROBE_INTERVAL_S`` per storage across all
  containers: the request that meets a failing or recovered storage does not wait for the
  next round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..clock import Clock
from ..control import ControlPlane
from ..observability.logging import logger
from ..observability.metrics import MetricsRegistry
from ..storage import StorageRegistry
from ..storage.base import StorageBackend
from ..storage.health import AvailabilityTracker, ProbeResult, probe_storage
from ..storage.health_store import StorageHealthStore
from ..stores.lease import Lease

PROBE_TIMEOUT_S = 5.0
#: A probe on the request path: the request has already failed, it must not hang as well.
REQUEST_PROBE_TIMEOUT_S = 1.0
FAIL_THRESHOLD = 2
RECOVER_THRESHOLD = 2
CONFIRM_DELAY_S = 2.0
REPROBE_INTERVAL_S = 5.0


class StorageProber:
    """Probes backends and records the results in the shared health store."""

    def __init__(
        self,
        store: StorageHealthStore,
        metrics: MetricsRegistry,
        clock: Clock,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.clock = clock
        #: Called once a probe round changed an availability (drop cached contexts).
        self.on_change = on_change

    def probe(
        self, backends: Sequence[StorageBackend], timeout_s: float, confirm: bool
    ) -> tuple[AvailabilityTracker, list[dict[str, Any]]]:
        """Probe ``backends`` and save what the tracker makes of it; with ``confirm``, a
        result that disagrees with the storage's state is checked again ``CONFIRM_DELAY_S``
        later, until it flips or agrees. Returns the tracker and the changes."""
        tracker = AvailabilityTracker(FAIL_THRESHOLD, RECOVER_THRESHOLD, clock=self.clock)
        for name, state in self.store.load().items():
            tracker.restore(name, state)
        changes: list[dict[str, Any]] = []
        pending = list(backends)
        while pending:
            for backend, result in zip(pending, _probe_all(pending, timeout_s), strict=True):
                change = tracker.observe(backend.name, result)
                if change is not None:
                    changes.append({"storage": change.storage, "available": change.available, "reason": change.reason})
                    logger.warning("storage availability changed", extra=changes[-1])
            pending = [b for b in pending if confirm and tracker.status(b.name).streak > 0]
            if pending:
                self.clock.sleep(CONFIRM_DELAY_S)
        for backend in backends:
            self.metrics.gauge(
                "data_storage.healthy_status", int(tracker.is_available(backend.name)), {"storage": backend.name}
            )
        self.store.save({b.name: tracker.status(b.name) for b in backends})
        if changes:
            self.on_change()
        return tracker, changes


def _probe_all(backends: Sequence[StorageBackend], timeout_s: float) -> list[ProbeResult]:
    if len(backends) == 1:
        return [probe_storage(backends[0], timeout_s)]
    with ThreadPoolExecutor(max_workers=min(8, len(backends))) as pool:
        return list(pool.map(lambda b: probe_storage(b, timeout_s), backends))


class HealthChecks:
    """The ``health_check`` schedule's work."""

    def __init__(
        self,
        lease: Lease,
        control: ControlPlane,
        storages: StorageRegistry,
        store: StorageHealthStore,
        prober: StorageProber,
    ) -> None:
        self.lease = lease
        self.control = control
        self.storages = storages
        self.store = store
        self.prober = prober

    def run_health_checks(self) -> dict[str, Any]:
        """Probe every storage (the lease holder only); returns what changed."""
        if not self.lease.try_acquire():
            return {"skipped": "lease held by another node"}
        records = self.control.list_storages()
        saved = set(self.store.load())
        backends = [self.storages.backend(r.config) for r in records]
        tracker, changes = self.prober.probe(backends, PROBE_TIMEOUT_S, confirm=True)
        names = {b.name for b in backends}
        self.prober.metrics.gauge("data_storage.last_health_round_time_s", self.prober.clock.now())
        self.store.forget(saved - names)
        return {
            "probed": len(backends),
            "changes": changes,
            "unavailable": sorted(n for n in names if not tracker.is_available(n)),
        }


class StorageReprobe:
    """What a read or write refused for want of a storage calls: probe the instance's
    storages now (rate-limited), so detection and recovery do not wait for the schedule."""

    def __init__(
        self,
        backends_of: Callable[[str], Sequence[StorageBackend]],
        store: StorageHealthStore,
        prober: StorageProber,
    ) -> None:
        self.backends_of = backends_of
        self.store = store
        self.prober = prober

    def __call__(self, instance_id: str, every_storage: bool) -> None:
        """Probe the storages of ``instance_id`` (every one, or only those out of service)
        not probed out of schedule in the last ``REPROBE_INTERVAL_S`` by any container.
        Never raises: the caller is failing already."""
        try:
            backends = self.backends_of(instance_id)
            if not every_storage:
                out = self.store.out_of_service()
                backends = [b for b in backends if b.name in out]
            due = [b for b in backends if self.store.claim_probe(b.name, int(REPROBE_INTERVAL_S * 1000))]
            if due:
                self.prober.probe(due, REQUEST_PROBE_TIMEOUT_S, confirm=False)
        except Exception:  # noqa: BLE001 - a re-probe is best effort; the request's own error is the answer
            logger.warning("storage re-probe for instance %s failed", instance_id, exc_info=True)
