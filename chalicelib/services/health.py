"""What checkHealth says about storages and groups: each storage's state with its reason,
and the groups that have a candidate out of service. A group that has no storage to write
to makes the service unhealthy (every start it gets fails), as does Valkey or the control
table not answering."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..control.records import StorageRecord
from ..protocol.models import GroupHealthInfo, InstanceGroup, StorageHealthInfo
from ..storage.health import StorageHealth

HEALTHY = "HEALTHY"
SUSPECT = "SUSPECT"
UNAVAILABLE = "UNAVAILABLE"
FULL = "FULL"
DISABLED = "DISABLED"
NOT_CHECKED = "NOT_CHECKED"
#: States in which a storage takes new blocks.
WRITABLE = frozenset({HEALTHY, SUSPECT, NOT_CHECKED})

NO_WRITABLE_STORAGE = "NO_WRITABLE_STORAGE"
DEGRADED = "DEGRADED"


def storage_health(record: StorageRecord, state: StorageHealth | None) -> StorageHealthInfo:
    """One storage's health: the operator's switch first, then the probes' verdict."""
    name = record.name
    if not record.available:
        return StorageHealthInfo(storage_unique_name=name, status=DISABLED, reason="disabled (disableStorage)")
    if state is None:
        return StorageHealthInfo(storage_unique_name=name, status=NOT_CHECKED, reason="not probed yet")
    since_ms = int(state.since * 1000)
    if not state.available:
        status = FULL if state.full else UNAVAILABLE
        return StorageHealthInfo(storage_unique_name=name, status=status, reason=state.last_error, since_ms=since_ms)
    if state.streak:
        reason = f"{state.last_error} ({state.streak} failed probe(s) in a row; not yet out of service)"
        return StorageHealthInfo(storage_unique_name=name, status=SUSPECT, reason=reason, since_ms=since_ms)
    return StorageHealthInfo(storage_unique_name=name, status=HEALTHY, since_ms=since_ms)


def assess(
    records: Sequence[StorageRecord], groups: Sequence[InstanceGroup], states: Mapping[str, StorageHealth]
) -> tuple[list[StorageHealthInfo], list[GroupHealthInfo]]:
    """Every storage's health, and the groups with a write candidate out of service (a
    group without candidates writes nowhere and is left out)."""
    storages = [storage_health(record, states.get(record.name)) for record in records]
    by_name = {s.storage_unique_name: s for s in storages}
    degraded = []
    for group in groups:
        if not group.storage_candidates:
            continue
        down = []
        writable = 0
        for name in group.storage_candidates:
            info = by_name.get(name)
            if info is None:
                down.append(f"{name}: does not exist")
            elif info.status in WRITABLE:
                writable += 1
            else:
                down.append(f"{name}: {info.status}" + (f": {info.reason}" if info.reason else ""))
        if down:
            degraded.append(
                GroupHealthInfo(
                    instance_group_name=group.name,
                    status=DEGRADED if writable else NO_WRITABLE_STORAGE,
                    reason="; ".join(down),
                )
            )
    return storages, degraded
