"""Every copy of a key, as getCacheMeta's ``replica_locations`` and getCacheMetaDetail list
them (upstream's newest meta service; docs/api-v2.md): the index's locations, whatever
their status, then the key's visible reported ones. Read-only views: nothing is touched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..index import Status
from ..index.records import BlockRecord
from ..protocol.codes import CacheLocationStatus, StorageType
from ..protocol.models import (
    CacheLocationDetail,
    CacheMetaDetailItem,
    KeyReplicas,
    ReplicaLocation,
    ReplicaSpec,
    SpecUri,
)
from .event_reports import Reported, reported_type_name
from .locations import LocationRenderer

#: The index's statuses by their wire names.
WIRE_STATUS = {
    Status.WRITING: CacheLocationStatus.CLS_WRITING,
    Status.SERVING: CacheLocationStatus.CLS_SERVING,
    Status.DELETING: CacheLocationStatus.CLS_DELETING,
}


@dataclass(frozen=True)
class Copy:
    """One copy of a key: its location id, status, storage type, specs and creation time."""

    location_id: str
    status: CacheLocationStatus
    storage_type: StorageType
    specs: list[tuple[str, str]]
    #: µs since the epoch; 0 when not kept (reported locations).
    create_time_us: int

    def replica(self) -> ReplicaLocation:
        """The copy as a ``replica_locations`` entry."""
        return ReplicaLocation(
            id=self.location_id,
            status=self.status,
            type=self.storage_type,
            spec_size=len(self.specs),
            create_time=self.create_time_us,
            location_specs=[ReplicaSpec(name=n, uri=u) for n, u in self.specs],
        )

    def detail(self) -> CacheLocationDetail:
        """The copy as a getCacheMetaDetail location."""
        return CacheLocationDetail(
            location_id=self.location_id,
            status=self.status,
            type=self.storage_type,
            spec_size=len(self.specs),
            create_time=self.create_time_us,
            location_specs=[SpecUri(name=n, uri=u) for n, u in self.specs],
        )


def stored_copies(renderer: LocationRenderer, block_key: int, raw: bytes, record: BlockRecord) -> list[Copy]:
    """The index's copies of a key, in the record's order. A record keeps one write time
    (the start that created it), given to each of its copies; a copy on a storage removed
    since has no type and no specs."""
    created = record.write_time_ms * 1000
    copies = []
    for status, location_id, text in renderer.render_each(block_key, raw):
        storage_type, specs = StorageType.ST_UNSPECIFIED, []
        if text is not None:
            location = json.loads(text)
            storage_type = StorageType[location["type"]]
            specs = [(s["name"], s["uri"]) for s in location["location_specs"]]
        copies.append(Copy(str(location_id), WIRE_STATUS[Status(status)], storage_type, specs, created))
    return copies


def reported_copies(locations: list[Reported]) -> list[Copy]:
    """A key's visible reported copies, one per reporter and medium (upstream's location ids,
    SERVING: a reported block is held)."""
    return [
        Copy(lid, CacheLocationStatus.CLS_SERVING, StorageType[reported_type_name(rid)], specs, 0)
        for rid, lid, _, specs in locations
    ]


def key_replicas(copies: list[Copy]) -> KeyReplicas:
    return KeyReplicas(locations=[c.replica() for c in copies])


def header_properties(record: BlockRecord) -> dict[str, str]:
    """The record header's fields by name, as strings (upstream's ``properties`` holds its
    block hash's raw fields; ``BP#prev_key`` is one of upstream's names)."""
    properties = {
        "last_access_s": str(record.last_access_s),
        "lfu": str(record.lfu),
        "write_time_ms": str(record.write_time_ms),
        "children": str(record.children),
    }
    if record.parent is not None:
        properties["BP#prev_key"] = str(record.parent)
    return properties


def detail_item(index: int, block_key: int, record: BlockRecord | None, copies: list[Copy]) -> CacheMetaDetailItem:
    """One key's getCacheMetaDetail item (``index``: its position in the request)."""
    parent = record.parent if record is not None else None
    return CacheMetaDetailItem(
        request_index=index,
        block_key=block_key,
        prev_block_key="" if parent is None else str(parent),
        properties=header_properties(record) if record is not None else {},
        locations=[c.detail() for c in copies],
    )
