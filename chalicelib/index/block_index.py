"""Valkey access for blocks, write sessions and usage: one script call per operation.

Layout per instance (every key shares the hash tag ``{<prefix>:<instance>}``, so an
instance's blocks, sessions and counters live on one cluster slot and move together in
one Lua call):

- ``T:b:<bucket>`` hashes of block records; bucket = low bits of the block key (scripts
  derive it, so a call packs one blob of keys rather than one argument per block). The
  buckets grow with the records, a split at a time (linear hashing: ``bucket_index``,
  lua/prelude.lua ``grow_buckets``), so that each keeps about ``RECORDS_PER_BUCKET``
  records and stays in Valkey's compact listpack encoding whatever the instance holds;
- ``T:ob`` the occupied buckets (integer members), so that scans, sampling and removal
  cost what the instance holds, never the buckets it was sized for;
- ``T:m`` counters (location ids, storage indexes) and the bucket count (``n``; without
  it, the ``2^bits`` the key space was registered with); ``T:u`` usage (bytes, keys, bytes per
  storage type ``t:<type>`` and per storage ``s:<name>``, and the part of bytes, keys
  and type bytes that is DELETING: ``d``, ``dk``, ``dt:<type>``); ``T:st`` storage index table;
- ``T:g`` live-block counts of packed groups (files), ``T:og`` groups whose files await
  deletion; ``T:fg`` locations forgotten by a metadata-only trim (VICTIM members), whose
  data stays on storage, charged, until the instance's removal deletes it;
  ``T:s:<session>`` write sessions and ``T:sd`` their deadlines; ``T:pd`` the DELETING
  locations (key, location id) scored by when their hand-off counts as lost.

``{<prefix>:deletions}:due`` names, for every instance with pending deletions, the times
they fall due (members ``<time>:<instance>``, added before a script marks): the recovery
of lost deletions (capacity/stranded.py) reads what is due, never every instance.

Per instance group, ``{<prefix>:grp:<group>}:u`` sums the usage of its instances (same
fields). Instances live on other slots than their group, so it moves right after each
script that changes an instance's usage (same pipeline as nothing else: one extra round
trip only when something changed); starts read it instead of every peer's usage.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from redis.commands.core import Script
from redis.exceptions import NoScriptError
from redis.typing import EncodableT, KeyT

from ..clock import Clock
from ..observability.hit_feed import STREAM_SUFFIX, FeedEntry
from ..observability.logging import logger
from ..valkey import Valkey, lua_source, valkey_errors
from .errors import InstanceGoneError, QuotaExceededError, StaleInstanceError, WriteSessionError
from .layout import (
    MAX_BUCKETS,
    PACKED_GROUP,
    SESSION_ENTRY,
    ClaimOutcome,
    FinishStatus,
    MarkScope,
    ReadMode,
    StartRefusal,
    StartResult,
    lua_constants,
)
from .records import BlockRecord, Victim, decode_record, decode_victims, encode_victims

LUA_DIR = Path(__file__).with_name("lua")
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


def _load(name: str) -> str:
    """An index script: the layout's constants, the prelude, then the script."""
    return lua_constants() + lua_source(LUA_DIR, name, prelude="prelude")


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
    """The positions of the right-most run of ``sw`` hits (empty without one); lua/read.lua
    finds the same window."""
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
    return struct.pack(f">{len(block_keys)}q", *block_keys)


def pack_u48(values: Sequence[int]) -> bytes:
    return b"".join(v.to_bytes(6, "big") for v in values)


def _packed_groups(blob: bytes) -> list[tuple[int, int]]:
    """(storage index, group id) of each packed group in a blob of them."""
    return [PACKED_GROUP.unpack_from(blob, o) for o in range(0, len(blob), PACKED_GROUP.size)]


def _merge(a: dict[str, int], b: dict[str, int], sign: int = 1) -> dict[str, int]:
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

    @classmethod
    def from_hash(cls, raw: RawHash) -> Usage:
        scalars = {b"bytes": 0, b"keys": 0, b"d": 0, b"dk": 0}
        by_type: dict[str, int] = {}
        by_storage: dict[str, int] = {}
        deleting_by_type: dict[str, int] = {}
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
        return cls(
            scalars[b"bytes"], scalars[b"keys"], by_type, by_storage, scalars[b"d"], scalars[b"dk"], deleting_by_type
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

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.bytes + other.bytes,
            self.keys + other.keys,
            _merge(self.by_type, other.by_type),
            _merge(self.by_storage, other.by_storage),
            self.deleting_bytes + other.deleting_bytes,
            self.deleting_keys + other.deleting_keys,
            _merge(self.deleting_by_type, other.deleting_by_type),
        )

    def fields(self) -> dict[str, int]:
        """The non-zero counters as usage-hash fields (for HINCRBY)."""
        out = {"bytes": self.bytes, "keys": self.keys, "d": self.deleting_bytes, "dk": self.deleting_keys}
        out.update({f"t:{t}": v for t, v in self.by_type.items()})
        out.update({f"s:{s}": v for s, v in self.by_storage.items()})
        out.update({f"dt:{t}": v for t, v in self.deleting_by_type.items()})
        return {k: v for k, v in out.items() if v}


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


@dataclass(frozen=True)
class DropOutcome:
    """What a compare-and-delete did."""

    dropped: int
    #: Packed groups (storage index, group id) whose last block is gone.
    orphan_groups: list[tuple[int, int]]
    freed: Usage


class BlockIndex:
    """Every read and state change of block records, usage and write sessions."""

    #: A served block's recency is refreshed at most once per this many seconds.
    TOUCH_INTERVAL_S = 1
    #: LFU counters lose one per this many seconds without access.
    LFU_DECAY_S = 60
    #: A location DELETING this much longer than its group's delete delay counts as a lost
    #: deletion (its hand-off failed) and may be handed to deletion again. Any sooner, a
    #: second deletion could overlap the first, and for storages naming objects by block
    #: key alone the late one could delete the object of a block written again meanwhile.
    DELETION_LOST_AFTER_S = 600
    #: Buckets per round trip when reading many (scans, removal, migration).
    SCAN_BATCH = 64
    #: Due times in ``{<prefix>:deletions}:due`` are rounded up to this many seconds: an
    #: instance marking all the time has one member per step, not one per call.
    DUE_STEP_S = 10
    #: ``resubmit_before_s`` taking every DELETING location (a removal: nothing can write
    #: the instance again, so no deletion can hit a newer block).
    EVERY_DELETION = 1 << 52
    #: A start splits a bucket while the instance holds more than this many records per
    #: bucket (lua/prelude.lua grow_buckets). A listpack lookup scans the bucket: at 8 an
    #: HGET costs about what it costs in a bucket of one record, for about 10 B per block
    #: more than at 64 (docs/record-layout.md, "Buckets").
    RECORDS_PER_BUCKET = 8

    def __init__(self, client: Valkey, prefix: str, clock: Clock) -> None:
        self.client = client
        self.prefix = prefix
        self.clock = clock
        self._read = client.register_script(_load("read"))
        self._start = client.register_script(_load("start"))
        self._finish = client.register_script(_load("finish"))
        self._mark = client.register_script(_load("mark"))
        self._restore = client.register_script(_load("restore"))
        self._drop = client.register_script(_load("drop"))
        self._claim = client.register_script(_load("claim"))
        self._forget = client.register_script(_load("forget"))
        self._release = client.register_script(_load("release"))
        self._storage = client.register_script(_load("storage"))
        #: Hash tag -> the bucket count last seen (reads name buckets with it; a read
        #: finding it out of date names them in Lua and returns the count now).
        self._bucket_counts: dict[bytes, int] = {}
        # Below the API: a sharded instance's calls split per shard and merge there
        # (imported here: sharding builds on this module).
        from .sharding import ShardedIndex

        self.sharded = ShardedIndex(self)

    def layout(
        self,
        instance_id: str,
        bucket_bits: int,
        group: str = "",
        incarnation: str = "",
        shard_suffixes: tuple[int, ...] = (),
    ) -> InstanceLayout:
        return InstanceLayout(self.prefix, instance_id, bucket_bits, group, incarnation, shard_suffixes)

    def _call(self, script: Script, keys: Sequence[KeyT], args: Sequence[EncodableT]) -> Any:
        with valkey_errors("index"):
            return script(keys=keys, args=args)

    @staticmethod
    def _queue_feed(pipe: Any, layout: InstanceLayout, entry: FeedEntry) -> None:
        """Append a hit-feed entry to the instance's stream (observability.hit_feed)."""
        pipe.xadd(layout.key(STREAM_SUFFIX), entry.fields(), maxlen=entry.max_len or None, approximate=True)

    def append_feed(self, layout: InstanceLayout, entry: FeedEntry) -> None:
        """Append a hit-feed entry on its own (a sharded instance's call has no single
        pipeline to ride on)."""
        pipe = self.client.pipeline(transaction=False)
        self._queue_feed(pipe, layout, entry)
        with valkey_errors("index"):
            pipe.execute()

    def _call_feeding(
        self, script: Script, keys: Sequence[KeyT], args: Sequence[EncodableT], layout: InstanceLayout, entry: FeedEntry
    ) -> Any:
        """``_call`` with a hit-feed entry in the same round trip: EVALSHA and XADD in one
        pipeline (a pipelined Script would check SCRIPT EXISTS first, a round trip more).
        A server without the script yet answers NOSCRIPT: the script is then called alone."""
        pipe = self.client.pipeline(transaction=False)
        pipe.evalsha(script.sha, len(keys), *keys, *args)
        self._queue_feed(pipe, layout, entry)
        with valkey_errors("index"):
            result, _ = pipe.execute(raise_on_error=False)
        if isinstance(result, NoScriptError):
            return self._call(script, keys, args)
        if isinstance(result, Exception):
            with valkey_errors("index"):
                raise result
        return result

    # ---------------------------------------------------------------- group usage

    def group_usage_key(self, group: str) -> str:
        return f"{{{self.prefix}:grp:{group}}}:u"

    def group_usage(self, groups: Sequence[str]) -> list[Usage]:
        """The summed usage of several groups, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for group in groups:
            pipe.hgetall(self.group_usage_key(group))
        with valkey_errors("index"):
            return [Usage.from_hash(raw) for raw in pipe.execute()]

    @staticmethod
    def _group_fields(usage: Usage) -> dict[str, int]:
        # Per-storage bytes are kept per instance only: no quota is set per storage.
        return {k: v for k, v in usage.fields().items() if not k.startswith("s:")}

    def _charge_group(self, layout: InstanceLayout, delta: Usage, sign: int = 1, pipe: Any = None) -> None:
        """Move the group's counters by what a script just changed in the instance's (queued
        on ``pipe`` when given: the caller executes it)."""
        changes = self._group_fields(delta)
        if not layout.group or not changes:
            return
        key = self.group_usage_key(layout.group)
        own = pipe is None
        pipe = self.client.pipeline(transaction=False) if own else pipe
        for name, value in changes.items():
            pipe.hincrby(key, name, sign * value)
        if own:
            with valkey_errors("index"):
                pipe.execute()

    def reconcile_group(self, group: str, layouts: Sequence[InstanceLayout]) -> Usage | None:
        """Correct drift of the group's counters (a process that died between an
        instance's script and the group's update) from the sum of its instances.

        The group counter is read before and after the instances; the correction is
        applied only if it did not move meanwhile, so changes in flight are never
        counted twice. Returns the correction applied, or None when it had to skip."""
        key = self.group_usage_key(group)
        with valkey_errors("index"):
            before = cast(RawHash, self.client.hgetall(key))
        total = sum(self.usage(layouts), Usage())
        with valkey_errors("index"):
            after = cast(RawHash, self.client.hgetall(key))
        if before != after:
            return None
        current = Usage.from_hash(after)
        correction = Usage(
            total.bytes - current.bytes,
            total.keys - current.keys,
            _merge(total.by_type, current.by_type, -1),
            {},
            total.deleting_bytes - current.deleting_bytes,
            total.deleting_keys - current.deleting_keys,
            _merge(total.deleting_by_type, current.deleting_by_type, -1),
        )
        changes = self._group_fields(correction)
        if changes:
            pipe = self.client.pipeline(transaction=False)
            for name, value in changes.items():
                pipe.hincrby(key, name, value)
            with valkey_errors("index"):
                pipe.execute()
        return correction

    def forget_group(self, group: str) -> None:
        """Drop a removed group's counters."""
        with valkey_errors("index"):
            self.client.delete(self.group_usage_key(group))

    # ---------------------------------------------------------------- reads

    def read_raw(
        self,
        layout: InstanceLayout,
        block_keys: Sequence[int],
        mode: int,
        sw_size: int = 0,
        servable: Sequence[str] | None = None,
        covered: Sequence[bool] | None = None,
        feed: FeedEntry | None = None,
    ) -> list[bytes | None]:
        """Records for ``block_keys`` in one round trip (see lua/read.lua for the modes),
        with ``feed`` appended to the instance's hit feed in it.

        Prefix mode stops at the first key without a SERVING location; batch and window
        modes return one entry per key. Entries are raw records (None = not served).
        ``servable`` names the storages whose locations may serve (None: any).
        ``covered`` flags keys served from elsewhere (reported locations): a miss there
        neither ends the prefix nor breaks the window.
        """
        if not block_keys:
            return []
        if layout.shard_suffixes:
            if feed is not None:
                self.append_feed(layout, feed)
            return self.sharded.read_raw(layout, block_keys, mode, sw_size, servable, covered)
        # The client names each key's bucket: building the names in Lua cost Valkey's
        # single thread about a fifth of the read (docs/index-read-path.md). Inlined
        # ``bucket_index``: this loop runs once per key of every read.
        prefix = layout.bucket_prefix
        count = self._bucket_counts.get(layout.tag) or 1 << layout.bucket_bits
        low = 1 << (count.bit_length() - 1)
        wide, narrow = 2 * low - 1, low - 1
        buckets = [b"%b%x" % (prefix, i if (i := k & wide) < count else k & narrow) for k in block_keys]
        keys: list[KeyT] = [layout.key("m"), layout.key("st"), *buckets]
        args: list[EncodableT] = [
            pack_keys(block_keys),
            int(mode),
            sw_size,
            int(self.clock.now()),
            self.TOUCH_INTERVAL_S,
            self.LFU_DECAY_S,
            "" if servable is None else "\n" + "\n".join(servable),
            count,
            *([b"".join(b"1" if c else b"0" for c in covered)] if covered else []),
        ]
        if feed is None:
            reply = self._call(self._read, keys, args)
        else:
            reply = self._call_feeding(self._read, keys, args, layout, feed)
        if isinstance(reply, list):  # the buckets split since ``count``: the count now
            reply, now = reply
            self._bucket_counts[layout.tag] = int(now)
        blob = cast(bytes, reply)
        out: list[bytes | None] = []
        pos, end = 0, len(blob)
        while pos < end:
            length = (blob[pos] << 8) | blob[pos + 1]
            pos += 2
            out.append(blob[pos : pos + length] if length else None)
            pos += length
        return out

    def read(
        self, layout: InstanceLayout, block_keys: Sequence[int], mode: int, sw_size: int = 0
    ) -> list[BlockRecord | None]:
        """Like ``read_raw`` with decoded records."""
        return [decode_record(r) if r else None for r in self.read_raw(layout, block_keys, mode, sw_size)]

    # ---------------------------------------------------------------- writes

    def start(
        self,
        layout: InstanceLayout,
        block_keys: Sequence[int],
        req: StartRequest,
        feed: Callable[[StartOutcome], FeedEntry | None] | None = None,
    ) -> StartOutcome:
        """Add WRITING locations for the keys that have none; all or nothing. Raises
        QuotaExceededError (with the shortfall) when a quota would be passed. ``feed``
        gives the grant's hit-feed entry, appended with the group's counters update."""
        if layout.shard_suffixes:
            outcome = self.sharded.start(layout, block_keys, req)
            entry = feed(outcome) if feed is not None else None
            if entry is not None:
                self.append_feed(layout, entry)
            return outcome
        outcome = self.grant(layout, block_keys, req)
        entry = feed(outcome) if feed is not None else None
        pipe = self.client.pipeline(transaction=False)
        self._charge_group(layout, outcome.charge(req.storage_type), pipe=pipe)
        if any(outcome.new_flags):  # a session was opened
            self.queue_session_deadline(pipe, layout.instance_id, req.deadline_ms)
        if entry is not None:
            self._queue_feed(pipe, layout, entry)
        if len(pipe):
            with valkey_errors("index"):
                pipe.execute()
        return outcome

    def grant(self, layout: InstanceLayout, block_keys: Sequence[int], req: StartRequest) -> StartOutcome:
        """The start script of one shard alone: the caller moves the group's counters by
        ``outcome.charge``."""
        keys = [
            layout.key("m"),
            layout.key("u"),
            layout.key("st"),
            layout.key("g"),
            layout.key("sd"),
            layout.session(req.session_id),
            layout.occupied,
            layout.key("pd"),
            layout.key("sc"),
        ]
        group = req.group_usage
        args: list[EncodableT] = [
            pack_keys(block_keys),
            int(self.clock.now() * 1000),
            req.session_id,
            req.deadline_ms,
            req.storage_name,
            req.storage_type,
            req.pack_count,
            pack_u48(req.sizes),
            bytes(req.spec_groups),
            pack_u48(req.explicit_groups) if req.explicit_groups else b"",
            req.group_capacity,
            -1 if group is None else group.bytes,
            req.type_capacity,
            -1 if group is None else group.by_type.get(req.storage_type, 0),
            req.max_keys,
            layout.bucket_prefix,
            self.RECORDS_PER_BUCKET,
            layout.instance_id,
            layout.incarnation,
            req.max_sessions,
            req.instance_capacity,
            max(1, req.min_replicas),
            b"".join(SESSION_ENTRY.pack(k.to_bytes(8, "big", signed=True), loc) for k, loc in req.stale),
            req.covers,
            max(1, math.isqrt(len(req.covers))),
            "1" if req.by_location else "0",
            len(req.more_candidates),
        ]
        for c in req.more_candidates:
            args += [c.name, c.storage_type, c.pack_count, c.type_capacity, c.group_type_bytes, int(c.by_location)]
        args.append(int(req.partial))
        args.append(self.pend_deletions(layout) if req.stale else 0)  # stale locations turn DELETING
        args += [req.max_caller_sessions if req.caller else 0, req.caller]
        result = self._call(self._start, keys, args)
        if result[0] == StartResult.REFUSED:
            reason = StartRefusal(result[1].decode())
            if reason == StartRefusal.GONE:
                raise InstanceGoneError(f"instance '{layout.instance_id}' is being removed or was registered again")
            raise QuotaExceededError(
                reason,
                {
                    StartRefusal.INSTANCE: "the instance's quota (instance_quotas) reached",
                    StartRefusal.GROUP: "instance group quota reached",
                    StartRefusal.TYPE: f"quota of storage type {req.storage_type} reached",
                    StartRefusal.KEYS: "max_key_count of the instance reached",
                    StartRefusal.STORAGES: f"the instance has written to 255 storages, the most it can address; "
                    f"{req.storage_name} is not one of them",
                    StartRefusal.SESSIONS: f"the instance has {req.max_sessions} write sessions open, the most "
                    f"allowed (KVCM_MAX_WRITE_SESSIONS): finish them, or wait for them to expire",
                    StartRefusal.CALLER_SESSIONS: f"account {req.caller!r} has {req.max_caller_sessions} write "
                    f"sessions open on the instance, the most one caller may (KVCM_MAX_WRITE_SESSIONS_PER_CALLER): "
                    f"finish them, or wait for them to expire",
                }[reason],
                int(result[2]) if len(result) > 2 else 0,
                req.storage_type,
            )
        written_to = tuple(c - ord("0") for c in result[2])
        storage_indexes = tuple(int(x) for x in result[3].split(b","))
        charge = [int(x) if x.isdigit() else x for x in result[7].split(b",")]
        return StartOutcome(
            int(result[1]),
            [c > 0 for c in written_to],
            storage_indexes[0],
            int(result[4]),
            written_to=written_to,
            storage_indexes=storage_indexes,
            created=int(result[6]),
            bytes_by_type={result[i].decode(): int(result[i + 1]) for i in range(8, len(result), 2)},
            victims=tuple(decode_victims(result[5])),
            pruned=Usage.from_charge(charge),
        )

    def session(self, layout: InstanceLayout, session_id: str) -> Session | None:
        """A write session's deadline and (key, location id) entries, or None."""
        if layout.shard_suffixes:
            return self.sharded.session(layout, session_id)
        with valkey_errors("index"):
            deadline, raw = cast(list[bytes | None], self.client.hmget(layout.session(session_id), "d", "k"))
        if deadline is None or raw is None:
            return None
        return Session(int(deadline), session_entries(raw), raw)

    def finish(
        self,
        layout: InstanceLayout,
        session_id: str,
        session: Session,
        success: Sequence[bool],
        sizes: Sequence[int],
        force_fail: bool = False,
    ) -> FinishOutcome:
        """Close ``session`` (as read by ``session``): successful blocks SERVING, the rest
        DELETING (returned). Raises WriteSessionError when the
        session is gone (finished, expired and reaped, never existed, or another
        instance's). ``sizes``: block bytes per spec group."""
        if layout.shard_suffixes:
            return self.sharded.finish(layout, session_id, session, success, sizes, force_fail)
        if len(success) != len(session.entries) and not force_fail:
            raise WriteSessionError(
                f"field 'success_blocks': the session has {len(session.entries)} blocks, the mask {len(success)}"
            )
        flags = bytes(ord("1") if s else ord("0") for s in success)
        now_ms = int(self.clock.now() * 1000)
        # Blocks fail (turn DELETING) when forced, reported failed, or the session expired.
        failing = force_fail or not all(success) or now_ms > session.deadline_ms
        reply = self._call(
            self._finish,
            [
                layout.key("sd"),
                layout.session(session_id),
                layout.key("u"),
                layout.key("st"),
                layout.key("pd"),
                layout.key("sc"),
            ],
            [
                now_ms,
                session_id,
                flags,
                "1" if force_fail else "0",
                session.raw,
                layout.bucket_prefix,
                pack_u48(sizes),
                layout.instance_id,
                self.pend_deletions(layout) if failing else 0,
            ],
        )
        status = FinishStatus(reply[0])
        if status in (FinishStatus.UNKNOWN, FinishStatus.CHANGED):
            raise WriteSessionError(f"write session {session_id!r} is unknown, finished or expired")
        self._charge_group(layout, Usage.from_charge(reply[3:]))
        uncommitted = [j for j, flag in enumerate(reply[2]) if flag == ord("1")]
        return FinishOutcome(status == FinishStatus.EXPIRED, decode_victims(reply[1]), uncommitted)

    # The reaper's due set: per instance with open sessions, a deadline no later than its
    # earliest session's. It lives on a slot of its own, so a start adds to it right after
    # its script (in the group counters' round trip); a start dying in between leaves its
    # session out until the reaper's full sweep (workflows.reaper.FULL_SWEEP_S).

    @property
    def _session_due_key(self) -> str:
        return f"{{{self.prefix}:reaper}}:due"

    def queue_session_deadline(self, pipe: Any, instance_id: str, deadline_ms: int) -> None:
        """Queue on ``pipe``: the instance has a session due at ``deadline_ms`` (the due
        set keeps the earliest)."""
        pipe.zadd(self._session_due_key, {instance_id: deadline_ms}, lt=True)

    def instances_due(self, now_ms: int, limit: int = 1000) -> list[str]:
        """The instances that may have a session past its deadline at ``now_ms``."""
        with valkey_errors("index"):
            due = cast(list[bytes], self.client.zrangebyscore(self._session_due_key, "-inf", now_ms, 0, limit))
        return [instance_id.decode() for instance_id in due]

    def rearm_session_deadlines(self, instance_ids: Sequence[str]) -> None:
        """Set each instance's place in the due set to its earliest open session's deadline,
        or take it out when it has none. Taken out first, then read: a start racing this
        adds its deadline after the removal, or its session is in the read."""
        if not instance_ids:
            return
        with valkey_errors("index"):
            self.client.zrem(self._session_due_key, *instance_ids)
        layouts = self.sharded.stored_layouts(instance_ids)
        pipe = self.client.pipeline(transaction=False)
        for layout in layouts:
            for shard in layout.shards:
                pipe.zrange(shard.key("sd"), 0, 0, withscores=True)
        with valkey_errors("index"):
            results = iter(pipe.execute())
        for layout in layouts:
            earliest = [int(score) for _ in layout.shards for _, score in next(results)]
            if earliest:
                self.queue_session_deadline(pipe, layout.instance_id, min(earliest))
        if len(pipe):
            with valkey_errors("index"):
                pipe.execute()

    def due_sessions(self, instance_ids: Sequence[str], now_ms: int, limit: int = 1000) -> dict[str, list[str]]:
        """Ids of sessions past their deadline, per instance (every shard's), in two round trips."""
        layouts = self.sharded.stored_layouts(instance_ids)
        pipe = self.client.pipeline(transaction=False)
        for layout in layouts:
            for shard in layout.shards:
                pipe.zrangebyscore(shard.key("sd"), "-inf", now_ms, start=0, num=limit)
        with valkey_errors("index"):
            results = iter(pipe.execute())
        due: dict[str, list[str]] = {}
        for layout in layouts:
            ids = dict.fromkeys(s.decode() for _ in layout.shards for s in next(results))
            if ids:
                due[layout.instance_id] = list(ids)
        return due

    def open_session_entries(self, layout: InstanceLayout) -> set[tuple[int, int]]:
        """(block key, location id) of every entry of the instance's open write sessions
        (every shard's), in two round trips (the background GC: a WRITING location whose
        session is still open is never an orphan)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.zrange(shard.key("sd"), 0, -1)
        with valkey_errors("index"):
            per_shard = cast(list[list[bytes]], pipe.execute())
        pipe = self.client.pipeline(transaction=False)
        for shard, session_ids in zip(layout.shards, per_shard, strict=True):
            for session_id in session_ids:
                pipe.hget(shard.session(session_id.decode()), "k")
        with valkey_errors("index"):
            blobs = cast(list[bytes | None], pipe.execute())
        return {
            (int.from_bytes(key, "big", signed=True), location_id)
            for raw in blobs
            if raw
            for key, location_id in (SESSION_ENTRY.unpack_from(raw, o) for o in range(0, len(raw), SESSION_ENTRY.size))
        }

    # ---------------------------------------------------------------- pending deletions

    @property
    def _due_key(self) -> str:
        return f"{{{self.prefix}:deletions}}:due"

    def pend_deletions(self, layout: InstanceLayout, delay_ms: int = 0) -> int:
        """The pending deadline (s) of locations about to turn DELETING in ``layout``,
        handed to deletion ``delay_ms`` after: their hand-off counts as lost after it.
        Registers the instance as due then, before the script runs, so a process dying
        between the mark and the hand-off leaves it found (a registration whose script
        never ran finds nothing and goes)."""
        deadline = int(self.clock.now()) - (-delay_ms // 1000) + self.DELETION_LOST_AFTER_S
        due = -(-deadline // self.DUE_STEP_S) * self.DUE_STEP_S
        with valkey_errors("index"):
            self.client.zadd(self._due_key, {f"{due}:{layout.instance_id}": due})
        return deadline

    def due_deletions(self, now_s: int, limit: int) -> dict[str, list[bytes]]:
        """Instances with deletions due by ``now_s``, each with its due members (at most
        ``limit`` members in all, oldest first)."""
        with valkey_errors("index"):
            members = cast(list[bytes], self.client.zrangebyscore(self._due_key, "-inf", now_s, start=0, num=limit))
        out: dict[str, list[bytes]] = {}
        for member in members:
            out.setdefault(member.split(b":", 1)[1].decode(), []).append(member)
        return out

    def settle_due(self, members: Sequence[bytes]) -> None:
        """Drop due members whose instance's overdue deletions were all handed over again:
        any location pending for later has a member of its own, due later."""
        if members:
            with valkey_errors("index"):
                self.client.zrem(self._due_key, *members)

    def overdue_deletions(self, layout: InstanceLayout, now_s: int, limit: int) -> list[tuple[int, int]]:
        """(block key, location id) of up to ``limit`` DELETING locations per shard whose
        hand-off counts as lost by ``now_s``, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.zrangebyscore(shard.key("pd"), "-inf", now_s, start=0, num=limit)
        with valkey_errors("index"):
            found = cast(list[list[bytes]], pipe.execute())
        return [session_entries(m)[0] for members in found for m in members]

    def mark_deleting(
        self,
        layout: InstanceLayout,
        block_keys: Sequence[int],
        sizes: Sequence[int],
        expected_locations: Sequence[int] | None = None,
        serving_only: bool = False,
        max_children: Sequence[int] | None = None,
        resubmit_before_s: int = 0,
        delay_ms: int = 0,
        lost_only: bool = False,
    ) -> list[Victim]:
        """Locations of ``block_keys`` → DELETING (they stop serving now); returns them.

        ``sizes`` are the block bytes per spec group, charged to the deleting counters.
        Every location returned is pending until its deletion drops it: lost if not
        dropped ``delay_ms`` (the delay it is handed over with) plus
        ``DELETION_LOST_AFTER_S`` after now. Unless ``serving_only``, DELETING locations
        lost by ``resubmit_before_s`` (s) are returned too, pending anew: removing a block
        again retries them; ``lost_only`` takes those alone (the recovery of lost deletions).
        ``expected_locations`` takes only those location ids; ``max_children`` skips a key
        whose record counts more children than its entry (one gained a child meanwhile).
        """
        if not block_keys:
            return []
        if layout.shard_suffixes:
            return self.sharded.mark_deleting(
                layout,
                block_keys,
                sizes,
                expected_locations,
                serving_only,
                max_children,
                resubmit_before_s,
                delay_ms,
                lost_only,
            )
        expected = b"".join(v.to_bytes(5, "big") for v in expected_locations) if expected_locations else b""
        limits = struct.pack(f">{len(max_children)}H", *max_children) if max_children else b""
        scope = MarkScope.SERVING if serving_only else MarkScope.LOST if lost_only else MarkScope.ANY
        reply = self._call(
            self._mark,
            [layout.key("u"), layout.key("st"), layout.key("pd")],
            [
                pack_keys(block_keys),
                expected,
                scope.value,
                layout.bucket_prefix,
                limits,
                int(self.clock.now()),
                resubmit_before_s,
                pack_u48(sizes),
                self.pend_deletions(layout, delay_ms),
            ],
        )
        self._charge_group(layout, Usage.from_charge(reply[1:]))
        return decode_victims(reply[0])

    def restore(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> int:
        """Undo ``mark_deleting`` for ``victims`` never handed to deletion (a write path
        eviction whose start was refused): each location still DELETING under its id
        serves again, its deleting charge released; returns how many."""
        if not victims:
            return 0
        if layout.shard_suffixes:
            return self.sharded.restore(layout, victims, sizes)
        reply = self._call(
            self._restore,
            [layout.key("u"), layout.key("st"), layout.key("pd")],
            [encode_victims(list(victims)), layout.bucket_prefix, pack_u48(sizes)],
        )
        self._charge_group(layout, Usage.from_charge(reply[1:]), -1)
        return int(reply[0])

    def drop(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> DropOutcome:
        """Compare-and-delete DELETING locations: their bytes are released."""
        if not victims:
            return DropOutcome(0, [], Usage())
        if layout.shard_suffixes:
            return self.sharded.drop(layout, victims, sizes)
        keys = [layout.key("u"), layout.key("st"), layout.key("g"), layout.key("og"), layout.occupied, layout.key("pd")]
        reply = self._call(
            self._drop,
            keys,
            [encode_victims(list(victims)), pack_u48(sizes), layout.bucket_prefix],
        )
        blob = reply[1]
        by_type = {reply[i].decode(): int(reply[i + 1]) for i in range(4, len(reply) - 1, 2)}
        freed = Usage(int(reply[2]), int(reply[3]), by_type, {}, int(reply[2]), int(reply[3]), dict(by_type))
        self._charge_group(layout, freed, -1)
        return DropOutcome(int(reply[0]), _packed_groups(blob), freed)

    def forget(self, layout: InstanceLayout, block_keys: Sequence[int], location_ids: Sequence[int]) -> int:
        """Drop the records of ``block_keys`` (still holding ``location_ids``, not DELETING)
        without deleting their data, which stays charged (lua/forget.lua); returns how many."""
        if not block_keys:
            return 0
        if layout.shard_suffixes:
            return self.sharded.forget(layout, block_keys, location_ids)
        forgotten = int(
            self._call(
                self._forget,
                [layout.key("u"), layout.occupied, layout.key("fg")],
                [
                    pack_keys(block_keys),
                    b"".join(v.to_bytes(5, "big") for v in location_ids),
                    layout.bucket_prefix,
                ],
            )
        )
        self._charge_group(layout, Usage(keys=forgotten), -1)
        return forgotten

    def forgotten(self, layout: InstanceLayout, count: int) -> list[Victim]:
        """Up to ``count`` forgotten locations of each shard, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.srandmember(shard.key("fg"), count)
        with valkey_errors("index"):
            members = cast(list[list[bytes]], pipe.execute())
        return decode_victims(b"".join(m for found in members for m in found))

    def release_forgotten(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> int:
        """Release forgotten locations whose data is deleted: their bytes leave the usage
        counters, the group's too (lua/release.lua); returns how many were still held."""
        from .sharding import shard_of  # sharding builds on this module

        released = 0
        for s, shard in enumerate(layout.shards):
            mine = [v for v in victims if shard_of(v.block_key, layout.shard_count) == s]
            if not mine:
                continue
            reply = self._call(
                self._release,
                [shard.key("u"), shard.key("st"), shard.key("g"), shard.key("fg")],
                [encode_victims(mine), pack_u48(sizes)],
            )
            by_type = {reply[i].decode(): int(reply[i + 1]) for i in range(2, len(reply) - 1, 2)}
            self._charge_group(shard, Usage(int(reply[1]), 0, by_type), -1)
            released += int(reply[0])
        return released

    def set_removing(self, layout: InstanceLayout, removing: bool) -> None:
        """Refuse (or again accept) new writes of the instance, every shard (lua/start.lua)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            if removing:
                pipe.hset(shard.key("m"), "removing", 1)
            else:
                pipe.hdel(shard.key("m"), "removing")
        with valkey_errors("index"):
            pipe.execute()

    def orphan_groups(self, layout: InstanceLayout) -> list[tuple[int, int]]:
        """Packed groups whose last block is gone and whose files are not deleted yet (group
        ids are unique across shards: lua/claim.lua)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.smembers(shard.key("og"))
        with valkey_errors("index"):
            members = [m for found in cast(list[set[bytes]], pipe.execute()) for m in found]
        return _packed_groups(b"".join(members))

    def forget_orphan_groups(self, layout: InstanceLayout, groups: Sequence[tuple[int, int]]) -> None:
        """Called once the files of ``groups`` are deleted."""
        if groups:
            with valkey_errors("index"):
                self.client.srem(layout.key("og"), *[PACKED_GROUP.pack(s, g) for s, g in groups])

    # ---------------------------------------------------------------- usage and tables

    def claim(
        self,
        instance_id: str,
        incarnation: str,
        wanted_bits: int,
        registering: bool = False,
        shard_count: int = 1,
        group: str = "",
    ) -> InstanceLayout:
        """Bind the instance's key space to ``incarnation`` and return its layout: its bucket
        bits (``wanted_bits`` unless fixed already: set once, kept until the key space is
        dropped) and its shards (``shard_count`` for a new key space or one a registration
        takes over, else those it has: docs/instance-sharding.md). See lua/claim.lua. A
        registration (``registering``) takes the key space over from an earlier
        incarnation, dropping what that one left (a registration lost from the control
        plane: its data cannot be deleted without its specs, and is logged); otherwise
        another incarnation's key space raises StaleInstanceError."""
        meta = InstanceLayout(self.prefix, instance_id, 0)
        wanted_shards = ",".join(str(s) for s in self.sharded.pick_suffixes(instance_id, shard_count))
        for _ in range(2):
            others_hold = registering and self.sharded.others_hold(instance_id)
            bits, outcome, stored = self._call(
                self._claim,
                [meta.key("m"), meta.occupied],
                [wanted_bits, incarnation, "1" if registering else "0", wanted_shards, "1" if others_hold else "0", 0],
            )
            layout = InstanceLayout(self.prefix, instance_id, int(bits), group, incarnation, parse_suffixes(stored))
            outcome = ClaimOutcome(outcome.decode())
            if outcome == ClaimOutcome.STALE:
                raise StaleInstanceError(f"instance '{instance_id}' was registered again")
            if outcome == ClaimOutcome.UNTRACKED:
                self._ensure_tracked(layout.shards[0])
            if outcome != ClaimOutcome.OCCUPIED:
                self.sharded.claim_shards(layout)
                return layout
            self._ensure_tracked(layout.shards[0])
            usage = self.usage([layout])[0]
            logger.warning(
                "dropping the blocks of an earlier registration of the instance; their data stays on storage",
                extra={"instance_id": instance_id, "blocks": usage.keys, "bytes": usage.bytes},
            )
            self.drop_all(layout)
        raise StaleInstanceError(f"instance '{instance_id}' kept changing during registration, retry")

    def _ensure_tracked(self, layout: InstanceLayout) -> None:
        with valkey_errors("index"):
            tracked = self.client.hget(layout.key("m"), "ob")
        if tracked is None:
            self.track_occupancy(layout)
            with valkey_errors("index"):
                self.client.hset(layout.key("m"), "ob", 1)

    def track_occupancy(self, layout: InstanceLayout) -> int:
        """Build the occupied-bucket set of an instance by probing every bucket (once per
        instance written before the set existed); returns how many are occupied."""
        found = 0
        step = 4096
        buckets = self.bucket_count(layout)
        for start in range(0, buckets, step):
            indexes = range(start, min(start + step, buckets))
            pipe = self.client.pipeline(transaction=False)
            for b in indexes:
                pipe.exists(layout.bucket(b))
            with valkey_errors("index"):
                occupied = [b for b, exists in zip(indexes, pipe.execute(), strict=True) if exists]
            if occupied:
                with valkey_errors("index"):
                    self.client.sadd(layout.occupied, *occupied)
                found += len(occupied)
        return found

    def usage(self, layouts: Sequence[InstanceLayout]) -> list[Usage]:
        """Usage of several instances (summed over their shards) in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for layout in layouts:
            for shard in layout.shards:
                pipe.hgetall(shard.key("u"))
        with valkey_errors("index"):
            results = iter(pipe.execute())
        return [sum((Usage.from_hash(next(results)) for _ in layout.shards), Usage()) for layout in layouts]

    def storage_names(self, layout: InstanceLayout) -> dict[int, str]:
        """Storage index → storage name, as assigned by starts (append-only)."""
        with valkey_errors("index"):
            raw = cast(RawHash, self.client.hgetall(layout.key("st")))
        return {int(k[1:]): v.decode() for k, v in raw.items() if k.startswith(b"#")}

    # ---------------------------------------------------------------- occupied buckets

    def bucket_counts(self, layout: InstanceLayout) -> list[int]:
        """How many buckets each shard's records are addressed over now (lua/prelude.lua
        bucket_count), one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.hmget(shard.key("m"), "n", "bits")
        with valkey_errors("index"):
            replies = cast(list[list[bytes | None]], pipe.execute())
        return [int(n) if n else 1 << int(bits or 0) for n, bits in replies]

    def bucket_count(self, layout: InstanceLayout) -> int:
        """How many buckets the instance's records are addressed over now (every shard's)."""
        return sum(self.bucket_counts(layout))

    def split_since(
        self, layout: InstanceLayout, counts: Sequence[int], sources_from: Sequence[int] = ()
    ) -> tuple[list[int], list[int]]:
        """The bucket counts now, and the buckets split off since each shard had ``counts``
        (bucket numbers as ``occupied_page`` gives them). With ``sources_from``, only if
        one of those splits took records from a bucket at or past its shard's entry (a
        split adding bucket b takes them from b - 2^L: lua/prelude.lua grow_buckets)."""
        now = self.bucket_counts(layout)
        shard_bits = SHARD_BUCKET_SHIFT if layout.shard_suffixes else 0
        added = [(s, b) for s, (was, count) in enumerate(zip(counts, now, strict=True)) for b in range(was, count)]
        if sources_from and not any(b - (1 << (b.bit_length() - 1)) >= sources_from[s] for s, b in added):
            return now, []
        return now, [b | (s << shard_bits if shard_bits else 0) for s, b in added]

    def occupied_count(self, layout: InstanceLayout) -> int:
        """How many buckets hold records (every shard's)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.scard(shard.occupied)
        with valkey_errors("index"):
            return sum(int(n) for n in pipe.execute())

    def occupied_page(self, layout: InstanceLayout, cursor: int, count: int) -> tuple[int, list[int]]:
        """One SSCAN page of the occupied buckets: (next cursor, 0 at the end; buckets)."""
        if layout.shard_suffixes:
            return self.sharded.occupied_page(layout, cursor, count)
        with valkey_errors("index"):
            cursor, members = self.client.sscan(layout.occupied, cursor, count=count)
        return int(cursor), [int(m) for m in members]

    def occupied_sample(self, layout: InstanceLayout, count: int) -> tuple[int, list[int]]:
        """How many buckets are occupied, and up to ``count`` distinct ones at random (all
        of them when fewer), in one round trip."""
        if layout.shard_suffixes:
            return self.sharded.occupied_sample(layout, count)
        pipe = self.client.pipeline(transaction=False)
        pipe.scard(layout.occupied)
        pipe.srandmember(layout.occupied, count)
        with valkey_errors("index"):
            total, members = pipe.execute()
        return int(total), [int(m) for m in members]

    def read_buckets(self, layout: InstanceLayout, buckets: Sequence[int]) -> list[tuple[int, bytes]]:
        """Every (block key, raw record) of several buckets, one round trip per
        ``SCAN_BATCH`` buckets."""
        out: list[tuple[int, bytes]] = []
        for start in range(0, len(buckets), self.SCAN_BATCH):
            pipe = self.client.pipeline(transaction=False)
            for b in buckets[start : start + self.SCAN_BATCH]:
                pipe.hgetall(layout.bucket(b))
            with valkey_errors("index"):
                contents = pipe.execute()
            out += [(int.from_bytes(f, "big", signed=True), r) for c in contents for f, r in c.items()]
        return out

    def scan(self, layout: InstanceLayout, page: int = 256) -> Iterator[tuple[int, bytes]]:
        """Every (block key, raw record) of an instance, through its occupied buckets."""
        cursor = 0
        while True:
            cursor, buckets = self.occupied_page(layout, cursor, page)
            yield from self.read_buckets(layout, buckets)
            if cursor == 0:
                return

    def drop_all(self, layout: InstanceLayout, keep_usage: bool = False) -> None:
        """Delete an instance's blocks and sessions (metadata only), and its usage unless
        ``keep_usage`` (the data stays on storage, charged). The small meta hash and the
        storage table stay: bucket bits, location ids and storage indexes must never
        restart, or a late deletion of an old location could match a new one.

        Costs the occupied buckets; the group's counters lose what the instance's had
        (its deleting part too, with ``keep_usage``: nothing of it will be dropped)."""
        if layout.shard_suffixes:
            for shard in layout.shards:
                self.drop_all(shard, keep_usage)
            return
        with valkey_errors("index"):
            usage = Usage.from_hash(cast(RawHash, self.client.hgetall(layout.key("u"))))
            session_ids = cast(list[bytes], self.client.zrange(layout.key("sd"), 0, -1))
            sessions = [layout.session(sid.decode()) for sid in session_ids]
        cursor = 0
        while True:
            cursor, buckets = self.occupied_page(layout, cursor, 1000)
            with valkey_errors("index"):
                if buckets:
                    self.client.unlink(*[layout.bucket(b) for b in buckets])
            if cursor == 0:
                break
        fixed = [layout.key(s) for s in ("g", "og", "sd", "sc", "dq", "fg", "pd")] + [layout.occupied]
        if keep_usage:
            # No record is left: nothing counts as DELETING or as a key any more.
            with valkey_errors("index"):
                self.client.hset(
                    layout.key("u"),
                    mapping={"keys": 0, "d": 0, "dk": 0, **{f"dt:{t}": 0 for t in usage.deleting_by_type}},
                )
            self._charge_group(
                layout,
                Usage(0, usage.keys, {}, {}, usage.deleting_bytes, usage.deleting_keys, dict(usage.deleting_by_type)),
                -1,
            )
        else:
            fixed.append(layout.key("u"))
            self._charge_group(layout, usage, -1)
        with valkey_errors("index"):
            for start in range(0, len(sessions), 1000):
                self.client.unlink(*sessions[start : start + 1000])
            self.client.unlink(*fixed)

    # ---------------------------------------------------------------- reclaim support
    # Added for chalicelib.capacity (the reclaimer): bounded reads of a few buckets, the
    # storage table with types, a per-instance sweep cursor, and the wake set.

    def storage_table(self, layout: InstanceLayout) -> dict[int, tuple[str, str]]:
        """Storage index → (storage name, storage type name), as assigned by starts: the
        type usage counters were charged to (lua/start.lua, lua/drop.lua)."""
        with valkey_errors("index"):
            raw = cast(RawHash, self.client.hgetall(layout.key("st")))
        return {
            int(k[1:]): (v.decode(), raw.get(b"t" + k[1:], b"").decode()) for k, v in raw.items() if k.startswith(b"#")
        }

    def advance_sweep(self, layout: InstanceLayout, count: int) -> list[int]:
        """The next about ``count`` occupied buckets of the instance's TTL sweep (an SSCAN
        cursor kept in Valkey, so successive rounds on any node cover every occupied
        bucket, and a pass costs what the instance holds)."""
        with valkey_errors("index"):
            position = int(self.client.hget(layout.key("m"), "sweep") or 0)
        position, buckets = self.occupied_page(layout, position, count)
        with valkey_errors("index"):
            self.client.hset(layout.key("m"), "sweep", position)
        return buckets

    # ---------------------------------------------------------------- deletion queue
    # Victims marked on the write path wait here for the reclaimer to hand them to the
    # deleter, so a write never waits for a Step Functions call.

    @property
    def _deletion_queue_set(self) -> str:
        return f"{{{self.prefix}:deleteq}}:instances"

    def queue_deletions(self, layout: InstanceLayout, victims: Sequence[Victim]) -> None:
        """Append victims (already DELETING) to the instance's deletion queue."""
        if not victims:
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(layout.key("dq"), encode_victims(list(victims)))
        pipe.sadd(self._deletion_queue_set, layout.instance_id)
        with valkey_errors("index"):
            pipe.execute()

    def take_queued_deletions(
        self, layout_of: Callable[[str], InstanceLayout | None], max_entries: int = 256
    ) -> dict[str, list[Victim]]:
        """Pop the queued victims of every instance that has some (``layout_of`` maps an
        instance id to its layout, None when it is gone: its queue is dropped). An
        instance leaves the set before its queue is read, so a push racing the read puts
        it back."""
        with valkey_errors("index"):
            instance_ids = [m.decode() for m in cast(set[bytes], self.client.smembers(self._deletion_queue_set))]
        out: dict[str, list[Victim]] = {}
        for instance_id in instance_ids:
            with valkey_errors("index"):
                self.client.srem(self._deletion_queue_set, instance_id)
            layout = layout_of(instance_id)
            key = (layout or InstanceLayout(self.prefix, instance_id, 0)).key("dq")
            with valkey_errors("index"):
                entries = cast(list[bytes] | None, self.client.lpop(key, max_entries)) or []
                if len(entries) == max_entries:
                    self.client.sadd(self._deletion_queue_set, instance_id)  # more next time
            if layout is not None and entries:
                out[instance_id] = [v for entry in entries for v in decode_victims(entry)]
        return out

    @property
    def _reclaim_wake_key(self) -> str:
        return f"{{{self.prefix}:reclaim}}:wake"

    def request_reclaim(self, group: str) -> None:
        """Ask the reclaimer to look at ``group`` in its next round."""
        with valkey_errors("index"):
            self.client.sadd(self._reclaim_wake_key, group)

    def take_reclaim_requests(self) -> set[str]:
        """The groups asked for since the last call, read and cleared atomically."""
        pipe = self.client.pipeline(transaction=True)
        pipe.smembers(self._reclaim_wake_key)
        pipe.delete(self._reclaim_wake_key)
        with valkey_errors("index"):
            members, _ = pipe.execute()
        return {m.decode() for m in members}
