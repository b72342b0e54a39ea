"""Reporter liveness (UPSTREAM_V2 §2.1), a scheduled function under the background lease.

A reporter silent past its heartbeat timeout is already hidden from queries (readers check
the heartbeat); past the cleanup grace after that it is unregistered here (the report
script would do the same on its next event), and the metadata of retired generations
(HOST_DOWN, the grace's end, a snapshot's predecessors) is deleted in batches. What was
reported for an instance that no longer exists is deleted too, and so is what reporters
reported under the layout before per-reporter records (they are asked for a snapshot).
"""

from __future__ import annotations

from typing import Any

from ..cache.event_reports import EventReports, liveness_of
from ..clock import Clock, now_ms
from ..control import ConfigCache
from ..observability.logging import logger
from ..protocol.errors import InstanceNotFoundError
from ..stores.lease import Lease
from ..stores.reporters import RID_TYPES, ReporterStore

_KINDS = {kind: storage_type for storage_type, kind in RID_TYPES.items()}


class ReporterLiveness:
    """The ``event_report_liveness`` schedule's work."""

    def __init__(
        self, lease: Lease, config: ConfigCache, reports: EventReports, store: ReporterStore, clock: Clock
    ) -> None:
        self.lease = lease
        self.config = config
        self.reports = reports
        self.store = store
        self.clock = clock

    def event_report_liveness(self) -> dict[str, Any]:
        """Expire silent reporters and clean retired generations; returns what was done."""
        if not self.lease.try_acquire():
            return {"skipped": "lease held by another node"}
        store = self.store
        now = now_ms(self.clock)
        checked, cleaned = 0, 0
        for instance_id in store.instances():
            try:
                record = self.config.instance(instance_id)
            except InstanceNotFoundError:  # removed (or being removed): what it reported goes too
                store.forget_instance(instance_id)
                continue
            storages = self.reports.storages(self.config.group(record.group))
            resynced = store.drop_legacy_layout(instance_id)
            if resynced:
                logger.info("event-report layout upgraded", extra={"instance_id": instance_id, "reporters": resynced})
            for rid in store.reporters(instance_id):
                storage_type = _KINDS.get(rid.partition("#")[0])
                config = storages.get(storage_type) if storage_type is not None else None
                checked += 1
                if config is not None:
                    retired = store.expire(instance_id, rid, now, liveness_of(config)).retired
                else:
                    state = store.reporter(instance_id, rid)
                    retired = state.retired if state else ""
                if retired:
                    cleaned += store.cleanup(instance_id, rid, retired)
        if cleaned:
            logger.info("event-report liveness", extra={"reporters": checked, "locations_cleaned": cleaned})
        return {"reporters": checked, "locations_cleaned": cleaned}
