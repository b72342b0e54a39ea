"""The compact binary block record and the victim descriptor (mirrors lua/prelude.lua).

A record is 23 bytes of header plus 16 bytes per location; URIs are not stored, they are
rebuilt from the storage config, the instance, the spec and the placement.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Optional

HEADER = struct.Struct(">B8sHIB")  # flags (bit 0: has parent), parent, children, last access (s), LFU counter
HEADER_LEN = 23
LOCATION_LEN = 16
VICTIM_LEN = 23


class Status(IntEnum):
    WRITING = 1
    SERVING = 2
    DELETING = 3


def _u(data: bytes, start: int, length: int) -> int:
    return int.from_bytes(data[start:start + length], "big")


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
    parent: Optional[int]
    children: int
    last_access_s: int
    lfu: int
    write_time_ms: int
    locations: tuple[LocationRecord, ...]

    def first(self, status: Status) -> Optional[LocationRecord]:
        """The first location in ``status``, or None."""
        for loc in self.locations:
            if loc.status == status:
                return loc
        return None


def decode_location(rec: bytes, offset: int) -> LocationRecord:
    return LocationRecord(Status(rec[offset]), rec[offset + 1], rec[offset + 2], _u(rec, offset + 3, 5),
                          _u(rec, offset + 8, 6), _u(rec, offset + 14, 2))


def location_status(rec: bytes, location_id: int) -> Optional[Status]:
    """The status of location ``location_id`` in a record, None when it has no such
    location (reads the few bytes needed: callers check thousands of records)."""
    for off in range(HEADER_LEN, HEADER_LEN + rec[HEADER_LEN - 1] * LOCATION_LEN, LOCATION_LEN):
        if int.from_bytes(rec[off + 3:off + 8], "big") == location_id:
            return Status(rec[off])
    return None


def location_ids(rec: bytes, status: Status) -> list[int]:
    """The ids of a record's locations in ``status`` (the few bytes needed, as above)."""
    return [int.from_bytes(rec[off + 3:off + 8], "big")
            for off in range(HEADER_LEN, HEADER_LEN + rec[HEADER_LEN - 1] * LOCATION_LEN, LOCATION_LEN)
            if rec[off] == status]


def last_access_s(rec: bytes) -> int:
    """The header's access time: a served block's last read, or when it turned DELETING."""
    return HEADER.unpack_from(rec, 0)[3]


def decode_record(rec: bytes) -> BlockRecord:
    """Parse one stored record."""
    flags, parent, children, atime, lfu = HEADER.unpack_from(rec, 0)
    count = rec[22]
    locations = tuple(decode_location(rec, HEADER_LEN + i * LOCATION_LEN) for i in range(count))
    return BlockRecord(
        parent=int.from_bytes(parent, "big", signed=True) if flags & 1 else None,
        children=children,
        last_access_s=atime,
        lfu=lfu,
        write_time_ms=_u(rec, 16, 6),
        locations=locations,
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
        return (self.block_key.to_bytes(8, "big", signed=True) + self.location_id.to_bytes(5, "big")
                + bytes((self.storage_index, self.spec_group)) + self.group_id.to_bytes(6, "big")
                + self.slot.to_bytes(2, "big"))

    def to_json(self) -> list[int]:
        return [self.block_key, self.location_id, self.storage_index, self.spec_group, self.group_id, self.slot]

    @classmethod
    def from_json(cls, data: list[int]) -> "Victim":
        return cls(*(int(v) for v in data))


#: A victim descriptor with its 5- and 6-byte fields split in two (struct has no such sizes).
_VICTIM = struct.Struct(">qBIBBHIH")


def decode_victims(blob: bytes) -> list[Victim]:
    """Parse the victims blob a script returned."""
    return [Victim(key, (id_hi << 32) | id_lo, sidx, spec_group, (group_hi << 32) | group_lo, slot)
            for key, id_hi, id_lo, sidx, spec_group, group_hi, group_lo, slot in _VICTIM.iter_unpack(blob)]


def encode_victims(victims: list[Victim]) -> bytes:
    return b"".join(v.encode() for v in victims)
