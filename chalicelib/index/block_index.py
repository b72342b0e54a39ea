"""Valkey access for blocks, write sessions and usage: one script call per operation.

Layout per instance (every key shares the hash tag ``{<prefix>:<instance>}``, so an
instance's blocks, sessions and counters live on one cluster slot and move together in
one Lua call):

- ``T:b:<bucket>`` hashes of block records; bucket = low bits of the block key (scripts
  derive it, so a call packs one blob of keys rather than one argument per block). The
  bucket count is fixed per instance (``bucket_bits``) and sized so a full instance
  keeps about 64 records per hash, which stays in Valkey's compact listpack encoding;
- ``T:m`` counters (location ids, storage indexes); ``T:u`` usage (bytes, keys, bytes per
  storage type ``t:<type>`` and per storage ``s:<name>``); ``T:st`` storage index table;
- ``T:g`` live-block counts of packed groups (files), ``T:og`` groups whose files await
  deletion; ``T:s:<session>`` write sessions and ``T:sd`` their deadlines.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Iterator, Optional, Sequence

import redis

from ..clock import Clock
from .errors import QuotaExceededError, WriteSessionError, valkey_errors
from .records import BlockRecord, Victim, decode_record, decode_victims, encode_victims

LUA_DIR = Path(__file__).with_name("lua")
MODE_PREFIX, MODE_BATCH, MODE_WINDOW, MODE_RAW = 1, 2, 3, 4


def _load(name: str) -> str:
    return (LUA_DIR / "prelude.lua").read_text() + "\n" + (LUA_DIR / f"{name}.lua").read_text()


@dataclass(frozen=True)
class InstanceLayout:
    """Key names of one instance."""

    prefix: str
    instance_id: str
    bucket_bits: int

    @cached_property
    def tag(self) -> bytes:
        return f"{{{self.prefix}:{self.instance_id}}}".encode()

    @cached_property
    def mask(self) -> int:
        return (1 << self.bucket_bits) - 1

    @cached_property
    def bucket_prefix(self) -> bytes:
        return self.tag + b":b:"

    def key(self, suffix: str) -> bytes:
        return self.tag + b":" + suffix.encode()

    @property
    def bucket_count(self) -> int:
        return 1 << self.bucket_bits

    def bucket(self, index: int) -> bytes:
        """Name of bucket ``index`` (scripts derive it from the key's low bits: lua bucket_of)."""
        return b"%b%x" % (self.bucket_prefix, index & self.mask)

    def all_buckets(self) -> list[bytes]:
        return [self.bucket(b) for b in range(self.bucket_count)]

    def session(self, session_id: str) -> bytes:
        return self.key(f"s:{session_id}")


def pack_keys(block_keys: Sequence[int]) -> bytes:
    return struct.pack(f">{len(block_keys)}q", *block_keys)


def pack_u48(values: Sequence[int]) -> bytes:
    return b"".join(v.to_bytes(6, "big") for v in values)


@dataclass(frozen=True)
class Usage:
    """Usage counters of one instance."""

    bytes: int = 0
    keys: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    by_storage: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_hash(cls, raw: dict) -> "Usage":
        by_type, by_storage = {}, {}
        total = keys = 0
        for k, v in raw.items():
            name, value = k.decode(), int(v)
            if name == "bytes":
                total = value
            elif name == "keys":
                keys = value
            elif name.startswith("t:"):
                by_type[name[2:]] = value
            elif name.startswith("s:"):
                by_storage[name[2:]] = value
        return cls(total, keys, by_type, by_storage)

    def __add__(self, other: "Usage") -> "Usage":
        def merge(a: dict, b: dict) -> dict:
            out = dict(a)
            for k, v in b.items():
                out[k] = out.get(k, 0) + v
            return out

        return Usage(self.bytes + other.bytes, self.keys + other.keys, merge(self.by_type, other.by_type),
                     merge(self.by_storage, other.by_storage))


@dataclass(frozen=True)
class StartOutcome:
    """What a start granted: the new keys' location ids and the storage index."""

    first_location_id: int
    new_flags: list[bool]
    storage_index: int


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
    others_bytes: int = 0
    type_capacity: int = 0
    others_type_bytes: int = 0
    max_keys: int = 0


@dataclass(frozen=True)
class Session:
    deadline_ms: int
    entries: list[tuple[int, int]]  # (block key, location id) of the session's new keys
    raw: bytes


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

    def __init__(self, client: redis.Redis, prefix: str, clock: Clock) -> None:
        self.client = client
        self.prefix = prefix
        self.clock = clock
        self._read = client.register_script(_load("read"))
        self._start = client.register_script(_load("start"))
        self._finish = client.register_script(_load("finish"))
        self._mark = client.register_script(_load("mark"))
        self._drop = client.register_script(_load("drop"))

    def layout(self, instance_id: str, bucket_bits: int) -> InstanceLayout:
        return InstanceLayout(self.prefix, instance_id, bucket_bits)

    def _call(self, script, keys, args):
        with valkey_errors("index"):
            return script(keys=keys, args=args)

    # ---------------------------------------------------------------- reads

    def read_raw(self, layout: InstanceLayout, block_keys: Sequence[int], mode: int,
                 sw_size: int = 0, servable: Optional[Sequence[str]] = None) -> list[Optional[bytes]]:
        """Records for ``block_keys`` in one round trip (see lua/read.lua for the modes).

        Prefix mode stops at the first key without a SERVING location; batch and window
        modes return one entry per key. Entries are raw records (None = not served).
        ``servable`` names the storages whose locations may serve (None: any).
        """
        if not block_keys:
            return []
        blob = self._call(self._read, [layout.key("m"), layout.key("st")],
                          [pack_keys(block_keys), mode, sw_size, int(self.clock.now()),
                           self.TOUCH_INTERVAL_S, self.LFU_DECAY_S, layout.bucket_prefix, layout.bucket_count,
                           "" if servable is None else "\n" + "\n".join(servable)])
        out: list[Optional[bytes]] = []
        pos, end = 0, len(blob)
        while pos < end:
            length = (blob[pos] << 8) | blob[pos + 1]
            pos += 2
            out.append(blob[pos:pos + length] if length else None)
            pos += length
        return out

    def read(self, layout: InstanceLayout, block_keys: Sequence[int], mode: int,
             sw_size: int = 0) -> list[Optional[BlockRecord]]:
        """Like ``read_raw`` with decoded records."""
        return [decode_record(r) if r else None for r in self.read_raw(layout, block_keys, mode, sw_size)]

    # ---------------------------------------------------------------- writes

    def start(self, layout: InstanceLayout, block_keys: Sequence[int], req: StartRequest) -> StartOutcome:
        """Add WRITING locations for the keys that have none; all or nothing."""
        keys = [layout.key("m"), layout.key("u"), layout.key("st"), layout.key("g"), layout.key("sd"),
                layout.session(req.session_id)]
        args = [pack_keys(block_keys), int(self.clock.now() * 1000), req.session_id, req.deadline_ms,
                req.storage_name, req.storage_type, req.pack_count, pack_u48(req.sizes),
                bytes(req.spec_groups), pack_u48(req.explicit_groups) if req.explicit_groups else b"",
                req.group_capacity, req.others_bytes, req.type_capacity, req.others_type_bytes, req.max_keys,
                layout.bucket_prefix, layout.bucket_count]
        result = self._call(self._start, keys, args)
        if result[0] == 0:
            reason = result[1].decode()
            raise QuotaExceededError(reason, {
                "group": "instance group quota reached",
                "type": f"quota of storage type {req.storage_type} reached",
                "keys": "max_key_count of the instance reached",
                "storages": f"the instance has written to 255 storages, the most it can address; "
                            f"{req.storage_name} is not one of them",
            }[reason])
        return StartOutcome(int(result[1]), [c == ord("1") for c in result[2]], int(result[3]))

    def session(self, layout: InstanceLayout, session_id: str) -> Optional[Session]:
        """A write session's deadline and (key, location id) entries, or None."""
        with valkey_errors("index"):
            deadline, raw = self.client.hmget(layout.session(session_id), "d", "k")
        if deadline is None:
            return None
        entries = [(int.from_bytes(raw[o:o + 8], "big", signed=True), int.from_bytes(raw[o + 8:o + 13], "big"))
                   for o in range(0, len(raw), 13)]
        return Session(int(deadline), entries, raw)

    def finish(self, layout: InstanceLayout, session_id: str, session: Session, success: Sequence[bool],
               force_fail: bool = False) -> tuple[bool, list[Victim]]:
        """Close ``session`` (as read by ``session``): successful blocks SERVING, the rest
        DELETING (returned). Returns (expired, victims); raises WriteSessionError when the
        session is gone (finished, expired and reaped, or never existed)."""
        if len(success) != len(session.entries) and not force_fail:
            raise WriteSessionError(
                f"field 'success_blocks': the session has {len(session.entries)} blocks, the mask {len(success)}")
        flags = bytes(ord("1") if s else ord("0") for s in success)
        status, blob = self._call(self._finish, [layout.key("sd"), layout.session(session_id)],
                                  [int(self.clock.now() * 1000), session_id, flags, "1" if force_fail else "0",
                                   session.raw, layout.bucket_prefix, layout.bucket_count])
        if status in (-1, -3):
            raise WriteSessionError(f"write session {session_id!r} is unknown, finished or expired")
        return status == -2, decode_victims(blob)

    def due_sessions(self, instance_ids: Sequence[str], now_ms: int, limit: int = 1000) -> dict[str, list[str]]:
        """Ids of sessions past their deadline, per instance, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for instance_id in instance_ids:
            pipe.zrangebyscore(InstanceLayout(self.prefix, instance_id, 0).key("sd"), "-inf", now_ms,
                               start=0, num=limit)
        with valkey_errors("index"):
            results = pipe.execute()
        return {i: [s.decode() for s in due] for i, due in zip(instance_ids, results) if due}

    def lost_deletions_before_s(self, delay_ms: int) -> int:
        """Locations that turned DELETING at or before this time (s) count as lost
        deletions, for a group deleting ``delay_ms`` after the mark."""
        return int(self.clock.now()) - delay_ms // 1000 - self.DELETION_LOST_AFTER_S

    def mark_deleting(self, layout: InstanceLayout, block_keys: Sequence[int],
                      expected_locations: Optional[Sequence[int]] = None,
                      serving_only: bool = False, max_children: Optional[Sequence[int]] = None,
                      resubmit_before_s: int = 0) -> list[Victim]:
        """Locations of ``block_keys`` → DELETING (they stop serving now); returns them.

        Unless ``serving_only``, locations that turned DELETING at or before
        ``resubmit_before_s`` are returned too (lost deletions, see
        ``lost_deletions_before_s``): removing a block again retries them.
        ``expected_locations`` takes only those location ids; ``max_children`` skips a key
        whose record counts more children than its entry (one gained a child meanwhile).
        """
        if not block_keys:
            return []
        expected = b"".join(v.to_bytes(5, "big") for v in expected_locations) if expected_locations else b""
        limits = struct.pack(f">{len(max_children)}H", *max_children) if max_children else b""
        blob = self._call(self._mark, [layout.key("m")],
                          [pack_keys(block_keys), expected, "S" if serving_only else "A", layout.bucket_prefix,
                           layout.bucket_count, limits, int(self.clock.now()), resubmit_before_s])
        return decode_victims(blob)

    def drop(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> tuple[int, list[tuple[int, int]]]:
        """Compare-and-delete DELETING locations; returns (dropped, packed groups now empty)."""
        if not victims:
            return 0, []
        keys = [layout.key("u"), layout.key("st"), layout.key("g"), layout.key("og")]
        dropped, blob = self._call(self._drop, keys, [encode_victims(list(victims)), pack_u48(sizes),
                                                      layout.bucket_prefix, layout.bucket_count])
        return int(dropped), [(blob[o], int.from_bytes(blob[o + 1:o + 7], "big")) for o in range(0, len(blob), 7)]

    def orphan_groups(self, layout: InstanceLayout) -> list[tuple[int, int]]:
        """Packed groups whose last block is gone and whose files are not deleted yet."""
        with valkey_errors("index"):
            members = self.client.smembers(layout.key("og"))
        return [(m[0], int.from_bytes(m[1:7], "big")) for m in members]

    def forget_orphan_groups(self, layout: InstanceLayout, groups: Sequence[tuple[int, int]]) -> None:
        """Called once the files of ``groups`` are deleted."""
        if groups:
            with valkey_errors("index"):
                self.client.srem(layout.key("og"), *[bytes((s,)) + g.to_bytes(6, "big") for s, g in groups])

    # ---------------------------------------------------------------- usage and tables

    def bucket_bits(self, instance_id: str, wanted: int) -> int:
        """The instance's bucket bits: ``wanted`` unless already fixed (set once, kept
        until the instance's keys are dropped)."""
        meta = InstanceLayout(self.prefix, instance_id, 0).key("m")
        pipe = self.client.pipeline(transaction=False)
        pipe.hsetnx(meta, "bits", wanted)
        pipe.hget(meta, "bits")
        with valkey_errors("index"):
            return int(pipe.execute()[1])

    def usage(self, layouts: Sequence[InstanceLayout]) -> list[Usage]:
        """Usage of several instances in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for layout in layouts:
            pipe.hgetall(layout.key("u"))
        with valkey_errors("index"):
            results = pipe.execute()
        return [Usage.from_hash(raw) for raw in results]

    def storage_names(self, layout: InstanceLayout) -> dict[int, str]:
        """Storage index → storage name, as assigned by starts (append-only)."""
        with valkey_errors("index"):
            raw = self.client.hgetall(layout.key("st"))
        return {int(k[1:]): v.decode() for k, v in raw.items() if k.startswith(b"#")}

    # ---------------------------------------------------------------- scans

    def scan(self, layout: InstanceLayout, batch: int = 64) -> Iterator[tuple[int, bytes]]:
        """Every (block key, raw record) of an instance, bucket by bucket."""
        buckets = layout.all_buckets()
        for start in range(0, len(buckets), batch):
            pipe = self.client.pipeline(transaction=False)
            for b in buckets[start:start + batch]:
                pipe.hgetall(b)
            with valkey_errors("index"):
                results = pipe.execute()
            for contents in results:
                for fld, rec in contents.items():
                    yield int.from_bytes(fld, "big", signed=True), rec

    def sample_bucket(self, layout: InstanceLayout, bucket: int) -> list[tuple[int, bytes]]:
        """Every (block key, raw record) of one bucket."""
        with valkey_errors("index"):
            contents = self.client.hgetall(layout.bucket(bucket))
        return [(int.from_bytes(f, "big", signed=True), r) for f, r in contents.items()]

    def drop_all(self, layout: InstanceLayout) -> None:
        """Delete an instance's blocks, sessions and usage (metadata only). The small meta
        hash and the storage table stay: bucket bits, location ids and storage indexes must
        never restart, or a late deletion of an old location could match a new one."""
        with valkey_errors("index"):
            sessions = [layout.session(sid.decode()) for sid in self.client.zrange(layout.key("sd"), 0, -1)]
            keys = layout.all_buckets() + sessions + [layout.key(s) for s in ("u", "g", "og", "sd")]
            for start in range(0, len(keys), 1000):
                self.client.unlink(*keys[start:start + 1000])

    # ---------------------------------------------------------------- reclaim support
    # Added for chalicelib.capacity (the reclaimer): bounded reads of a few buckets, the
    # storage table with types, a per-instance sweep cursor, and the wake set.

    def sample_buckets(self, layout: InstanceLayout, buckets: Sequence[int]) -> list[tuple[int, bytes]]:
        """Every (block key, raw record) of several buckets, in one round trip."""
        if not buckets:
            return []
        pipe = self.client.pipeline(transaction=False)
        for b in buckets:
            pipe.hgetall(layout.bucket(b))
        with valkey_errors("index"):
            contents = pipe.execute()
        return [(int.from_bytes(f, "big", signed=True), r) for c in contents for f, r in c.items()]

    def storage_table(self, layout: InstanceLayout) -> dict[int, tuple[str, str]]:
        """Storage index → (storage name, storage type name), as assigned by starts: the
        type usage counters were charged to (lua/start.lua, lua/drop.lua)."""
        with valkey_errors("index"):
            raw = self.client.hgetall(layout.key("st"))
        return {int(k[1:]): (v.decode(), raw.get(b"t" + k[1:], b"").decode())
                for k, v in raw.items() if k.startswith(b"#")}

    def advance_sweep(self, layout: InstanceLayout, count: int, cursor: str = "sweep") -> list[int]:
        """Claim the next ``count`` buckets (at most all) of one of the instance's sweeps (a
        cursor kept in Valkey, so successive rounds on any node cover every bucket)."""
        count = min(count, layout.bucket_count)
        with valkey_errors("index"):
            end = self.client.hincrby(layout.key("m"), cursor, count)
        return [(end - count + i) % layout.bucket_count for i in range(count)]

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
