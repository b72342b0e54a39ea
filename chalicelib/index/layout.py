"""The block record layout and the codes the index scripts share with Python, defined once.

Python reads records with these names; the Lua scripts get the same names as constants
generated from this module (``lua_constants``, prepended to every index script at load
time: Valkey scripts cannot import). docs/record-layout.md describes the layout.

Formats are spelled as the Lua ``struct`` library spells them (``I5`` a 5-byte unsigned
integer, ``c8`` 8 raw bytes), big-endian. Python's ``struct`` has no 5- or 6-byte
integers: ``Struct.split`` reads each of those as two parts (high byte or half-word, low
word), and ``unpack_from`` joins them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any

#: Lua struct code -> the Python struct codes reading it (5- and 6-byte integers in two parts).
_PYTHON_CODES = {"B": "B", "H": "H", "I4": "I", "I5": "BI", "I6": "HI", "c8": "8s"}


@dataclass(frozen=True)
class Field:
    """One field of a fixed-size layout."""

    name: str
    #: The Lua struct code ("B", "H", "I4", "I5", "I6", "c8").
    code: str
    #: Offset from the start of the layout (0-based).
    offset: int

    @property
    def size(self) -> int:
        return struct.calcsize(">" + _PYTHON_CODES[self.code])

    @property
    def format(self) -> str:
        """The field alone, as a Lua struct format."""
        return ">" + self.code


class Struct:
    """A fixed-size big-endian layout: named fields in order, no padding."""

    def __init__(self, lua_name: str, fields: Iterable[tuple[str, str]]) -> None:
        #: The layout's name in Lua (``<lua_name>_FMT``, ``<lua_name>_LEN``: ``lua_constants``).
        self.lua_name = lua_name
        self.fields: dict[str, Field] = {}
        offset = 0
        for name, code in fields:
            field = Field(name, code, offset)
            self.fields[name] = field
            offset += field.size
        #: Bytes of the whole layout.
        self.size = offset
        #: The one spelling of the layout (Lua struct library syntax).
        self.format = ">" + "".join(f.code for f in self.fields.values())
        #: The same bytes for Python's struct, 5- and 6-byte integers read in two parts
        #: (hot paths unpack with it and join those parts themselves).
        self.split = struct.Struct(">" + "".join(_PYTHON_CODES[f.code] for f in self.fields.values()))
        self._wide = [f.code in ("I5", "I6") for f in self.fields.values()]

    def offset(self, name: str) -> int:
        """Offset of field ``name`` from the start of the layout."""
        return self.fields[name].offset

    def unpack_from(self, buffer: bytes, offset: int = 0) -> tuple[Any, ...]:
        """The fields' values at ``offset`` (integers, ``c<n>`` fields as bytes)."""
        parts = iter(self.split.unpack_from(buffer, offset))
        return tuple((next(parts) << 32) | next(parts) if wide else next(parts) for wide in self._wide)

    def pack(self, *values: int | bytes) -> bytes:
        """The bytes of one instance of the layout, fields in order."""
        parts: list[int | bytes] = []
        for value, wide in zip(values, self._wide, strict=True):
            if wide:
                assert isinstance(value, int)
                parts += [value >> 32, value & 0xFFFFFFFF]
            else:
                parts.append(value)
        return self.split.pack(*parts)


#: A block record starts with this header (hash field = the 8-byte big-endian block key).
HEADER = Struct(
    "HDR",
    [
        ("flags", "B"),
        ("parent", "c8"),
        ("children", "H"),
        ("last_access_s", "I4"),
        ("lfu", "B"),
        ("write_time_ms", "I6"),
        ("location_count", "B"),
    ],
)
#: ``location_count`` locations follow the header.
LOCATION = Struct(
    "LOC",
    [
        ("status", "B"),
        ("storage_index", "B"),
        ("spec_group", "B"),
        ("location_id", "I5"),
        ("group_id", "I6"),
        ("slot", "H"),
    ],
)
#: An adopted record (flag ADOPTED) ends with its adopter's sequence number, after its
#: locations (lua/start.lua, "Child counts"); readers walk locations by count and never see it.
ADOPTER = Struct("ADOPTER", [("sequence", "I5")])
#: A tiered Mark (flag MARKED: UPSTREAM_V2 §2.11 "Mark"), the record's last bytes, after
#: its adopter if any: the next write of the block goes to that storage (its index in the
#: storage table) until the expiry (ms). A record without a mark carries none of it.
MARK = Struct("TIER_MARK", [("storage_index", "B"), ("expiry_ms", "I6")])
#: A location handed to deletion (compare-and-delete matches key and location id).
VICTIM = Struct(
    "VICTIM",
    [
        ("block_key", "c8"),
        ("location_id", "I5"),
        ("storage_index", "B"),
        ("spec_group", "B"),
        ("group_id", "I6"),
        ("slot", "H"),
    ],
)
#: One entry of a write session's key list: a new key and the location it got.
SESSION_ENTRY = Struct("SESSION_ENTRY", [("block_key", "c8"), ("location_id", "I5")])
#: A sharded session's key's position in the whole start request (its 'o' field: lua/start.lua).
REQUEST_POSITION = Struct("POSITION", [("position", "I4")])
#: A packed group (the files of several blocks): the group refcount and orphan-set member.
PACKED_GROUP = Struct("PACKED_GROUP", [("storage_index", "B"), ("group_id", "I6")])

#: A child count stays at this, the most the header's field holds.
MAX_CHILDREN = (1 << 8 * HEADER.fields["children"].size) - 1
#: The LFU counter of a new record (as Redis's LFU_INIT_VAL: a new key is not evicted first).
LFU_INITIAL = 5
#: Buckets are addressed by a block key's low 24 bits (lua/prelude.lua key_hash): the most
#: buckets one instance (one shard) may grow to.
MAX_BUCKETS = 1 << 24
#: The most buckets one start splits (lua/prelude.lua grow_buckets): a call moves at most
#: that many buckets' records, and a start of up to 1,024 new records keeps its instance
#: at its records per bucket (BlockIndex.RECORDS_PER_BUCKET).
MAX_SPLITS_PER_CALL = 128


class Status(IntEnum):
    """A location's status byte."""

    WRITING = 1
    SERVING = 2
    DELETING = 3


class RecordFlag(IntEnum):
    """Bits of the header's ``flags`` (an IntEnum, not an IntFlag: hot paths test them
    on plain ints, and IntFlag would build a flag object per test)."""

    HAS_PARENT = 1
    #: Linked to its parent's record through the adopter tail (lua/start.lua "Child counts").
    ADOPTED = 2
    #: DELETING and taken off its parent's child count already (prelude unlink_from_parent).
    UNLINKED = 4
    #: Carries a tiered Mark (``MARK``) at its end.
    MARKED = 8


class ReadMode(IntEnum):
    """What a read (index/reads.py ``answer``) returns for a list of keys."""

    PREFIX = 1
    BATCH = 2
    WINDOW = 3
    RAW = 4


class MarkScope(str, Enum):
    """Which locations lua/mark.lua takes."""

    SERVING = "S"
    #: WRITING and SERVING ones, and lost deletions.
    ANY = "A"
    #: Lost deletions only (the recovery: capacity/stranded.py).
    LOST = "L"


class MarkClear(str, Enum):
    """When lua/finish.lua clears a tiered Mark whose target a finished location is on
    (the group's ``mark_clear_policy``)."""

    #: Any location of the block turning SERVING on the target.
    NEXT_WRITE = "w"
    #: Only one that holds every spec the block's other SERVING locations hold.
    FULL_BLOCK = "f"


class StartResult(IntEnum):
    """First element of lua/start.lua's reply."""

    REFUSED = 0
    GRANTED = 1


class StartRefusal(str, Enum):
    """Why lua/start.lua refused (second element of a refusal)."""

    GONE = "gone"
    #: The instance's own byte quota.
    INSTANCE = "instance"
    GROUP = "group"
    TYPE = "type"
    KEYS = "keys"
    STORAGES = "storages"
    SESSIONS = "sessions"
    #: The calling account's own open sessions on the instance (auth on).
    CALLER_SESSIONS = "caller_sessions"


class FinishStatus(IntEnum):
    """First element of lua/finish.lua's reply."""

    FINISHED = 1
    UNKNOWN = -1
    EXPIRED = -2
    CHANGED = -3
    #: The session is a quarantined Copy (lua/copy_quarantine.lua) and the caller did not
    #: name its guard state (only a release does), or named another.
    GUARDED = -4


class CopyGuard(IntEnum):
    """A tiered Copy's guard state (the wire's ``guard_state``; docs/tiered-storage.md
    "Copy quarantine"): ACTIVE while its execution runs it, QUARANTINED once its copy timed
    out (its writer may still write the targets). Released, the session is gone."""

    ACTIVE = 1
    QUARANTINED = 2


class HoldResult(IntEnum):
    """First element of lua/copy_quarantine.lua's reply."""

    HELD = 1
    HELD_ALREADY = 0
    UNKNOWN = -1


class ClaimOutcome(str, Enum):
    """Second element of lua/claim.lua's reply."""

    OK = "ok"
    UNTRACKED = "untracked"
    STALE = "stale"
    OCCUPIED = "occupied"


#: Enums given to Lua, with the prefix of their constants' names.
_LUA_ENUMS: tuple[tuple[str, type[Enum]], ...] = (
    ("", Status),
    ("", RecordFlag),
    ("MODE_", ReadMode),
    ("MARK_", MarkScope),
    ("CLEAR_", MarkClear),
    ("START_", StartResult),
    ("REFUSED_", StartRefusal),
    ("FINISH_", FinishStatus),
    ("GUARD_", CopyGuard),
    ("HOLD_", HoldResult),
    ("CLAIM_", ClaimOutcome),
)


def _lua_literal(value: int | str) -> str:
    return f"'{value}'" if isinstance(value, str) else str(value)


def lua_constants() -> str:
    """This module as Lua ``local`` constants, prepended to every index script.

    Per layout ``<P>``: ``<P>_FMT`` and ``<P>_LEN``, and for the header and location fields
    ``<P>_<FIELD>`` with ``<P>_<FIELD>_FMT``: a header field's name is its 1-based position
    in a record (as string.byte and struct.unpack count); a location field's is its offset
    from the location's position (prelude ``loc_pos``). Every enum member is a constant
    (``SERVING``, ``UNLINKED``, ``MODE_RAW``, ``FINISH_EXPIRED``...)."""
    lines = ["-- Generated from chalicelib/index/layout.py when the script is loaded: do not edit."]
    for layout in (HEADER, LOCATION, ADOPTER, MARK, VICTIM, SESSION_ENTRY, REQUEST_POSITION, PACKED_GROUP):
        lines.append(f"local {layout.lua_name}_FMT, {layout.lua_name}_LEN = '{layout.format}', {layout.size}")
    for layout, prefix, base in ((HEADER, "H", 1), (LOCATION, "L", 0)):
        for field in layout.fields.values():
            const = f"{prefix}_{field.name.upper()}"
            lines.append(f"local {const}, {const}_FMT = {field.offset + base}, '{field.format}'")
    for prefix, enum in _LUA_ENUMS:
        for member in enum:
            lines.append(f"local {prefix}{member.name} = {_lua_literal(member.value)}")
    lines.append(f"local MAX_CHILDREN, LFU_INITIAL = {MAX_CHILDREN}, {LFU_INITIAL}")
    lines.append(f"local MAX_BUCKETS, MAX_SPLITS_PER_CALL = {MAX_BUCKETS}, {MAX_SPLITS_PER_CALL}")
    return "\n".join(lines) + "\n"
