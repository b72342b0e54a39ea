"""Block records and victim descriptors as Python reads them (the layout is in layout.py).

A record is a header plus one location per copy of the block; URIs are not stored, they
are rebuilt from the storage config, the instance, the spec and the placement.
"""

from __future__ import annotations

from dataclasses import dataclass

from .layout import HEADER, LOCATION, VICTIM, RecordFlag, Status

# Readers below take the few bytes they need: callers check thousands of records.
_COUNT_AT = HEADER.offset("location_count")
_WRITE_TIME_AT = HEADER.offset("write_time_ms")
_WRITE_TIME_END = _WRITE_TIME_AT + HEADER.fields["write_time_ms"].size
_STATUS_AT = LOCATION.offset("status")
_ID_AT = LOCATION.offset("location_id")
_ID_END = _ID_AT + LOCATION.fields["location_id"].size


@dataclass(frozen=True)
class LocationRecord:
    status: Status
    storage_index: int
    spec_group: int
    location_id: int
    group_id: int
    slot: int


@dataclass(frozen=True)
class BlockRecord:
    parent: int | None
    children: int
    last_access_s: int
    lfu: int
    write_time_ms: int
    locations: tuple[LocationRecord, ...]


def location_offsets(rec: bytes) -> range:
    """Where each location of a record starts."""
    return range(HEADER.size, HEADER.size + rec[_COUNT_AT] * LOCATION.size, LOCATION.size)


def location_id_at(rec: bytes, offset: int) -> int:
    """The id of the location starting at ``offset``."""
    return int.from_bytes(rec[offset + _ID_AT : offset + _ID_END], "big")


def decode_location(rec: bytes, offset: int) -> LocationRecord:
    status, storage_index, spec_group, location_id, group_id, slot = LOCATION.unpack_from(rec, offset)
    return LocationRecord(Status(status), storage_index, spec_group, location_id, group_id, slot)


def location_status(rec: bytes, location_id: int) -> Status | None:
    """The status of location ``location_id`` in a record, None when it has no such location."""
    for off in location_offsets(rec):
        if location_id_at(rec, off) == location_id:
            return Status(rec[off + _STATUS_AT])
    return None


def write_time_ms(rec: bytes) -> int:
    """When the record was written (its start)."""
    return int.from_bytes(rec[_WRITE_TIME_AT:_WRITE_TIME_END], "big")


def decode_record(rec: bytes) -> BlockRecord:
    """Parse one stored record."""
    flags, parent, children, atime, lfu, wtime, _ = HEADER.unpack_from(rec)
    return BlockRecord(
        parent=int.from_bytes(parent, "big", signed=True) if flags & RecordFlag.HAS_PARENT else None,
        children=children,
        last_access_s=atime,
        lfu=lfu,
        write_time_ms=wtime,
        locations=tuple(decode_location(rec, off) for off in location_offsets(rec)),
    )


@dataclass(frozen=True)
class Victim:
    """A location handed to deletion: compare-and-delete matches key and location id."""

    block_key: int
    location_id: int
    storage_index: int
    spec_group: int
    group_id: int
    slot: int

    def encode(self) -> bytes:
        return VICTIM.pack(
            self.block_key.to_bytes(8, "big", signed=True),
            self.location_id,
            self.storage_index,
            self.spec_group,
            self.group_id,
            self.slot,
        )

    def to_json(self) -> list[int]:
        return [self.block_key, self.location_id, self.storage_index, self.spec_group, self.group_id, self.slot]

    @classmethod
    def from_json(cls, data: list[int]) -> Victim:
        return cls(*(int(v) for v in data))


def decode_victims(blob: bytes) -> list[Victim]:
    """Parse the victims blob a script returned."""
    return [
        Victim(int.from_bytes(key, "big", signed=True), location_id, storage_index, spec_group, group_id, slot)
        for key, location_id, storage_index, spec_group, group_id, slot in (
            VICTIM.unpack_from(blob, off) for off in range(0, len(blob), VICTIM.size)
        )
    ]


def encode_victims(victims: list[Victim]) -> bytes:
    return b"".join(v.encode() for v in victims)
