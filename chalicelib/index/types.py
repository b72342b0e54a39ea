"""The index's values: instance layouts (key names), usage counters, start requests and
the outcomes of starts, finishes and drops, with the packing helpers the scripts' callers
share. No Valkey access here (``tag_index``, ``sharding`` and ``block_index`` build on it)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from .layout import MAX_BUCKETS, PACKED_GROUP, SESSION_ENTRY, MarkClear, ReadMode
from .records import Victim

#: A sharded instance's bucket numbers (occupied pages, samples, sweeps) carry their
#: shard from this bit up; bucket bits stay below (at most 24: lua/prelude.lua bucket_of).
SHARD_BUCKET_SHIFT = 24
#: A hash as the client returns it: its clients are built with decode_responses=False, which
#: redis-py's annotations (bytes | str) cannot know, hence the casts of replies below.
RawHash = dict[bytes, bytes]
MODE_PREFIX, MODE_BATCH, MODE_WINDOW, MODE_RAW = ReadMode.PREFIX, ReadMode.BATCH, ReadMode.WINDOW, ReadMode.RAW
#: A new key space starts with 2^FIRST_BUCKET_BITS buckets; starts split them as records
#: come (``BlockIndex.RECORDS_PER_BUCKET``).
FIRST_BUCKET_BITS = 4


def bucket_index(block_key: int, bucket_count: int) -> int:
    """The bucket of ``block_key`` among ``bucket_count`` (linear hashing on the key's low
    24 bits: bucket ``h mod 2^(L+1)``, or ``h mod 2^L`` when that one is not split yet,
    for 2^L <= bucket_count < 2^(L+1)); lua/prelude.lua ``bucket_index`` is the same."""
    low = 1 << (bucket_count.bit_length() - 1)
    # With bucket_count <= MAX_BUCKETS, a bit the mask takes past the 24 makes the index
    # too large, and the low mask then leaves the 24 bits, as Lua reads them.
    index = block_key & (2 * low - 1)
    return index if index < bucket_count else index & (low - 1)


@dataclass(frozen=True)
class InstanceLayout:
    """Key names of one instance."""

    prefix: str
    instance_id: str
    #: The key space's first bucket level (2^bucket_bits buckets), as registered: starts
    #: split buckets from there (``BlockIndex.bucket_count``).
    bucket_bits: int
    #: The instance group whose usage counters move with this instance's ("": none).
    group: str = ""
    #: The registration the key space is bound to (lua/claim.lua; "": not checked).
    incarnation: str = ""
    #: Hash-tag suffixes of shards 1.. of a sharded instance (empty: one shard;
    #: docs/instance-sharding.md). Such a layout names shard 0's keys.
    shard_suffixes: tuple[int, ...] = ()
    #: This layout's hash-tag suffix when it is shard 1.. of a sharded instance.
    suffix: int | None = None

    @cached_property
    def tag(self) -> bytes:
        if self.suffix is None:
            return f"{{{self.prefix}:{self.instance_id}}}".encode()
        return f"{{{self.prefix}:{self.instance_id}#{self.suffix}}}".encode()

    @property
    def shard_count(self) -> int:
        return 1 + len(self.shard_suffixes)

    @cached_property
    def shards(self) -> tuple[InstanceLayout, ...]:
        """The layout of each shard, shard 0 first (one shard: this layout)."""
        if not self.shard_suffixes:
            return (self,)
        first = replace(self, shard_suffixes=())
        return (first, *(replace(first, suffix=s) for s in self.shard_suffixes))

    @cached_property
    def bucket_prefix(self) -> bytes:
        return self.tag + b":b:"

    def key(self, suffix: str) -> bytes:
        return self.tag + b":" + suffix.encode()

    def bucket(self, index: int) -> bytes:
        """Name of bucket ``index`` (scripts derive a key's: ``bucket_index``, lua bucket_of).
        In a sharded instance, bits from ``SHARD_BUCKET_SHIFT`` up name the shard."""
        if self.shard_suffixes:
            return self.shards[index >> SHARD_BUCKET_SHIFT].bucket(index)
        return b"%b%x" % (self.bucket_prefix, index & (MAX_BUCKETS - 1))

    @cached_property
    def occupied(self) -> bytes:
        return self.key("ob")

    def session(self, session_id: str) -> bytes:
        return self.key(f"s:{session_id}")


def rightmost_window(hits: Sequence[bool], sw: int) -> range:
    """The positions of the right-most run of ``sw`` hits (empty without one): a window
    read's answer (index/reads.py, and a sharded read over its shards' answers)."""
    run = 0
    for i in range(len(hits) - 1, -1, -1):
        run = run + 1 if hits[i] else 0
        if run == sw:
            return range(i, i + sw)
    return range(0)


def parse_suffixes(stored: bytes | None) -> tuple[int, ...]:
    """The shard suffixes lua/claim.lua keeps (b'' or None: one shard)."""
    return tuple(int(s) for s in stored.split(b",")) if stored else ()


def session_entries(raw: bytes) -> list[tuple[int, int]]:
    """(block key, location id) of each entry of a session's 'k' field."""
    return [
        (int.from_bytes(key, "big", signed=True), location_id)
        for key, location_id in (SESSION_ENTRY.unpack_from(raw, o) for o in range(0, len(raw), SESSION_ENTRY.size))
    ]


def pack_keys(block_keys: Sequence[int]) -> bytes:
    """Block keys as the scripts take them: 8 bytes big-endian each."""
    return struct.pack(f">{len(block_keys)}q", *block_keys)


def pack_u48(values: Sequence[int]) -> bytes:
    """Values as 6-byte big-endian integers (block sizes, group ids)."""
    return b"".join(v.to_bytes(6, "big") for v in values)


def packed_groups(blob: bytes) -> list[tuple[int, int]]:
    """(storage index, group id) of each packed group in a blob of them."""
    return [PACKED_GROUP.unpack_from(blob, o) for o in range(0, len(blob), PACKED_GROUP.size)]


def merge_counts(a: dict[str, int], b: dict[str, int], sign: int = 1) -> dict[str, int]:
    """``a`` plus ``sign`` times ``b``, per name."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + sign * v
    return out


@dataclass(frozen=True)
class Usage:
    """Usage counters of one instance (or, summed, of a group).

    ``bytes``, ``keys`` and ``by_type`` follow the data that exists, DELETING locations
    included until their deletion drops them; the ``deleting_*`` fields are that
    DELETING part. Quotas and watermarks count ``live()``: what is not on its way out.
    """

    bytes: int = 0
    keys: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    by_storage: dict[str, int] = field(default_factory=dict)
    deleting_bytes: int = 0
    deleting_keys: int = 0
    deleting_by_type: dict[str, int] = field(default_factory=dict)
    #: Bytes per storage type of the sources a reclaim demote is copying away (``mt:<type>``,
    #: moved by migrate_begin.lua and finish.lua; instances only, live bytes still): what
    #: reclaim counts as freed until the copy ends (docs/tiered-storage.md).
    demoting_by_type: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_hash(cls, raw: RawHash) -> Usage:
        scalars = {b"bytes": 0, b"keys": 0, b"d": 0, b"dk": 0}
        by_type: dict[str, int] = {}
        by_storage: dict[str, int] = {}
        deleting_by_type: dict[str, int] = {}
        demoting_by_type: dict[str, int] = {}
        for k, v in raw.items():
            value = int(v)
            if k in scalars:
                scalars[k] = value
            elif k.startswith(b"t:"):
                by_type[k[2:].decode()] = value
            elif k.startswith(b"s:"):
                by_storage[k[2:].decode()] = value
            elif k.startswith(b"dt:"):
                deleting_by_type[k[3:].decode()] = value
            elif k.startswith(b"mt:"):
                demoting_by_type[k[3:].decode()] = value
        return cls(
            scalars[b"bytes"],
            scalars[b"keys"],
            by_type,
            by_storage,
            scalars[b"d"],
            scalars[b"dk"],
            deleting_by_type,
            demoting_by_type,
        )

    @classmethod
    def from_charge(cls, reply: Sequence[Any]) -> Usage:
        """The deleting charge a script returned (lua/prelude.lua ``deleting_charge``):
        bytes, keys, then type/bytes pairs."""
        by_type = {reply[i].decode(): int(reply[i + 1]) for i in range(2, len(reply) - 1, 2)}
        return cls(deleting_bytes=int(reply[0]), deleting_keys=int(reply[1]), deleting_by_type=by_type)

    def live(self) -> Usage:
        """What is not DELETING (per storage: the totals, which are not split)."""
        return Usage(
            max(0, self.bytes - self.deleting_bytes),
            max(0, self.keys - self.deleting_keys),
            {t: max(0, v - self.deleting_by_type.get(t, 0)) for t, v in self.by_type.items()},
            dict(self.by_storage),
        )

    def reclaimable(self) -> Usage:
        """What reclaim rounds measure: ``live()`` less, per type, what a demote is copying
        away (its bytes leave the type when the copy ends; the total keeps them, they move)."""
        live = self.live()
        return replace(live, by_type={t: max(0, v - self.demoting_by_type.get(t, 0)) for t, v in live.by_type.items()})

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.bytes + other.bytes,
            self.keys + other.keys,
            merge_counts(self.by_type, other.by_type),
            merge_counts(self.by_storage, other.by_storage),
            self.deleting_bytes + other.deleting_bytes,
            self.deleting_keys + other.deleting_keys,
            merge_counts(self.deleting_by_type, other.deleting_by_type),
            merge_counts(self.demoting_by_type, other.demoting_by_type),
        )

    def fields(self) -> dict[str, int]:
        """The non-zero counters as usage-hash fields (for HINCRBY)."""
        out = {"bytes": self.bytes, "keys": self.keys, "d": self.deleting_bytes, "dk": self.deleting_keys}
        out.update({f"t:{t}": v for t, v in self.by_type.items()})
        out.update({f"s:{s}": v for s, v in self.by_storage.items()})
        out.update({f"dt:{t}": v for t, v in self.deleting_by_type.items()})
        return {k: v for k, v in out.items() if v}


@dataclass(frozen=True)
class MarkClearing:
    """When a finish clears a tiered Mark (the group's ``mark_clear_policy``)."""

    policy: MarkClear
    #: Spec group coverage (``cache.marks.spec_group_coverage``; b"": every location
    #: covers every group), for ``MarkClear.FULL_BLOCK``.
    covers: bytes = b""


@dataclass(frozen=True)
class MarkCounts:
    """What one script did to tiered Marks (lua/start.lua, finish.lua; docs/tiered-storage.md)."""

    #: Keys written to their Mark's target (start).
    routed: int = 0
    #: Marks cleared: expired (start), or consumed by a write or Copy on the target (finish).
    expired: int = 0
    consumed: int = 0
    #: Flags whose bytes were no Mark (start).
    malformed: int = 0
    #: The instance's Marks after the script, when it changed or used any (else None).
    active: int | None = None


@dataclass(frozen=True)
class StartOutcome:
    """What a start granted: the new keys' location ids and the storage index."""

    first_location_id: int
    new_flags: list[bool]
    storage_index: int
    #: Bytes the new keys charge.
    new_bytes: int = 0
    #: (location id, group id, slot) of each new key when the start spanned shards, whose
    #: ids do not follow one another (empty: they follow ``first_location_id``).
    placements: tuple[tuple[int, int, int], ...] = ()
    #: Per request key, the candidate it was written to (1: ``storage_name``, 2..: the
    #: request's ``more_candidates`` in order; 0: not written). Empty: candidate 1.
    written_to: tuple[int, ...] = ()
    #: Storage index of each candidate (0: never written to).
    storage_indexes: tuple[int, ...] = ()
    #: Records created (the other written keys got one more location); None: every one.
    created: int | None = None
    #: Bytes added per storage type (empty: all of ``storage_type`` passed to ``charge``).
    bytes_by_type: dict[str, int] = field(default_factory=dict)
    #: Stale locations the start turned DELETING, for deletion, and their deleting charge.
    victims: tuple[Victim, ...] = ()
    pruned: Usage = field(default_factory=Usage)
    #: Its tiered Marks: keys routed to their target, Marks cleared.
    marks: MarkCounts = field(default_factory=MarkCounts)

    def placements_of(
        self, written: Sequence[tuple[int, int]], pack_counts: Sequence[int], explicit: Sequence[int]
    ) -> list[tuple[int, int, int]]:
        """(location id, group id, slot) of each written key, given as (request index,
        candidate), with each candidate's pack count; mirrors lua/start.lua: ids follow one
        another in key order, a packing storage fills a file with the next blocks written
        to it, explicit group ids are candidate 1's."""
        if self.placements:  # a start spanning shards placed its keys per shard
            return list(self.placements)
        out = []
        filled: dict[int, tuple[int, int]] = {}  # candidate -> (blocks written to it, its file's group id)
        for j, (i, candidate) in enumerate(written):
            location_id = self.first_location_id + j
            pack_count = pack_counts[candidate - 1]
            group, slot = 0, 0
            if pack_count > 0:
                count, group = filled.get(candidate, (0, 0))
                if count % pack_count == 0:
                    group = location_id
                slot = count % pack_count
                filled[candidate] = (count + 1, group)
            elif candidate == 1 and explicit:
                group = explicit[i]
            out.append((location_id, group, slot))
        return out

    def charge(self, storage_type: str) -> Usage:
        """What the new keys add to the usage counters (and stale locations to the deleting ones)."""
        new_keys = sum(self.new_flags) if self.created is None else self.created
        by_type = self.bytes_by_type or ({storage_type: self.new_bytes} if self.new_bytes else {})
        return Usage(self.new_bytes, new_keys, dict(by_type)) + self.pruned


@dataclass(frozen=True)
class Candidate:
    """A storage a start may write to after the first (lua/start.lua's further candidates)."""

    name: str
    storage_type: str
    pack_count: int
    #: The quota of its storage type (0: none).
    type_capacity: int
    #: The group's live bytes of that type as last read (-1: not read).
    group_type_bytes: int
    #: Whether it addresses blocks by location (several of one key may live there).
    by_location: bool


@dataclass(frozen=True)
class StartRequest:
    """Arguments of one start (see lua/start.lua)."""

    session_id: str
    deadline_ms: int
    storage_name: str
    storage_type: str
    pack_count: int
    sizes: Sequence[int]  # block bytes per spec group index (0 = every spec)
    spec_groups: Sequence[int]  # spec group index per key
    explicit_groups: Sequence[int] = ()
    group_capacity: int = 0
    type_capacity: int = 0
    max_keys: int = 0
    #: The most write sessions the instance may have open (0 = no limit).
    max_sessions: int = 0
    #: Who starts (with auth on, the account) and the most sessions it may have open on
    #: the instance (0 = no limit).
    caller: str = ""
    max_caller_sessions: int = 0
    #: The instance's own byte quota (0 = none).
    instance_capacity: int = 0
    #: The group's live usage as last read (None: not read; only this instance counts).
    group_usage: Usage | None = None
    #: A key is skipped once this many of its locations cover its spec group (§2.6).
    min_replicas: int = 1
    #: (block key, location id) of SERVING locations whose data is gone: not counted,
    #: turned DELETING.
    stale: Sequence[tuple[int, int]] = ()
    #: covers[a * n + b] == ord("1") when a location of spec group b holds every spec of group a
    #: (n = the number of spec groups, 0 included); empty: every location covers.
    covers: bytes = b""
    #: Whether ``storage_name`` addresses blocks by location (several of one key may live there).
    by_location: bool = False
    #: Further candidates for keys ``storage_name`` cannot take, in order.
    more_candidates: Sequence[Candidate] = ()
    #: Grant the longest leading run of the keys to write that fits the quotas, instead
    #: of all or nothing (refused only when not even the first fits).
    partial: bool = False
    #: A shard's part of a sharded start: each key's position in the whole request, kept
    #: with the session for its finish (lua/start.lua 'o'); empty: none kept.
    positions: Sequence[int] = ()


@dataclass(frozen=True)
class Session:
    deadline_ms: int
    entries: list[tuple[int, int]]  # (block key, location id) of the session's new keys
    raw: bytes


@dataclass(frozen=True)
class FinishOutcome:
    """What closing a write session did."""

    #: The session had expired (or was failed): every block failed.
    expired: bool
    #: The locations now DELETING, for deletion.
    victims: list[Victim]
    #: Session positions (0-based, the order of its entries) reported successful whose
    #: location was no longer WRITING (a removeCache or trim took it): not served.
    uncommitted: list[int] = field(default_factory=list)
    #: Session positions that failed because their session (a sharded session: their
    #: shard's part) had expired; every position when ``expired`` on one shard.
    lapsed: list[int] = field(default_factory=list)
    #: Tiered Marks the finish cleared (``consumed``).
    marks: MarkCounts = field(default_factory=MarkCounts)


@dataclass(frozen=True)
class DropOutcome:
    """What a compare-and-delete did."""

    dropped: int
    #: Packed groups (storage index, group id) whose last block is gone.
    orphan_groups: list[tuple[int, int]]
    freed: Usage
