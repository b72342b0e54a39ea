"""Deletions the reclaimer started that have not finished yet.

Usage counters fall only when a location is really deleted (lua/drop.lua), which comes
``delay_before_delete_ms`` or a workflow's run after the location was marked DELETING.
Until then the next round would see the same excess and reclaim it a second time, so the
reclaimer remembers what it marked and counts it as freed while it is still DELETING.

Kept in memory by the node holding the lease: a node that takes over may reclaim one
step too many, once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..index import BlockIndex, InstanceLayout, Status, Usage
from ..index.block_index import MODE_RAW
from ..index.records import location_status


@dataclass(frozen=True)
class _Marked:
    location_id: int
    size: int
    storage_type: str


class PendingDeletions:
    """Locations marked by the reclaimer, per instance, oldest first."""

    def __init__(self, verify_limit: int = 8192) -> None:
        #: At most this many entries are re-read per instance and round; the rest
        #: (younger) are assumed still pending, which errs on the side of freeing less.
        self.verify_limit = verify_limit
        self._by_instance: dict[str, dict[int, _Marked]] = {}

    def add(self, instance_id: str, marked: Iterable[tuple[int, int, int, str]]) -> None:
        """Remember (block key, location id, bytes, storage type) of locations just marked."""
        entries = self._by_instance.setdefault(instance_id, {})
        for key, location_id, size, storage_type in marked:
            entries[key] = _Marked(location_id, size, storage_type)

    def outstanding(self, index: BlockIndex, layout: InstanceLayout, instance_id: str) -> Usage:
        """What of the instance is still marked and not deleted; forgets the rest."""
        entries = self._by_instance.get(instance_id)
        if not entries:
            return Usage()
        keys = list(entries)[:self.verify_limit]
        for key, raw in zip(keys, index.read_raw(layout, keys, MODE_RAW)):
            if raw is None or location_status(raw, entries[key].location_id) != Status.DELETING:
                del entries[key]
        if not entries:
            del self._by_instance[instance_id]
            return Usage()
        by_type: dict[str, int] = {}
        for mark in entries.values():
            by_type[mark.storage_type] = by_type.get(mark.storage_type, 0) + mark.size
        return Usage(sum(m.size for m in entries.values()), len(entries), by_type)

    def retain(self, instance_ids: set[str]) -> None:
        """Forget the instances not in ``instance_ids`` (removed ones)."""
        for instance_id in [i for i in self._by_instance if i not in instance_ids]:
            del self._by_instance[instance_id]
