"""The read path's pure part: the commands of a read, and what it answers from the records.

A read is no script (docs/index-read-path.md, "Reads without a script"): a script pays Valkey's
Lua bridge for every ``redis.call``, about 1.8 µs a key where a client's HGET costs 0.5 µs,
and one shard's single thread serves every read of an instance. ``TagIndex.read_raw`` sends
``read_command``'s bytes on one connection (MULTI, the bucket count, the storage table when
storages are filtered, one HGET per key, EXEC: one round trip, one atomic snapshot), and
``answer`` decides here what lua/read.lua decided in Valkey: which records serve, the prefix
or the window, and which records are due a recency refresh. The refresh, the one write a
read makes, goes to lua/touch.lua (atomic per record), sent once the answer is known, its
reply read with the index's next call (``TagIndex.settle``), so the caller waits for one
round trip.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..resp import EXEC, MULTI, command
from .layout import HEADER, LFU_INITIAL, LOCATION, ReadMode, Status
from .types import InstanceLayout, rightmost_window

_COUNT_AT = HEADER.offset("location_count")
_ATIME_AT = HEADER.offset("last_access_s")
_LFU_AT = HEADER.offset("lfu")
_STATUS = LOCATION.offset("status")
_STORAGE = LOCATION.offset("storage_index")
_FIRST_STATUS = HEADER.size + _STATUS
_SERVING = int(Status.SERVING)
_U32 = struct.Struct(">I")
#: The most an LFU counter reaches (one byte).
LFU_MAX = 255


def bucket_names(layout: InstanceLayout, block_keys: Sequence[int], count: int) -> list[bytes]:
    """Each key's bucket among ``count`` (``types.bucket_index`` inlined: this runs once per
    key of every read)."""
    prefix = layout.bucket_prefix
    low = 1 << (count.bit_length() - 1)
    wide, narrow = 2 * low - 1, low - 1
    return [b"%b%x" % (prefix, i if (i := k & wide) < count else k & narrow) for k in block_keys]


def read_command(
    layout: InstanceLayout, buckets: Sequence[bytes], fields: Sequence[bytes], with_table: bool, tail: bytes = b""
) -> bytes:
    """The read's bytes: MULTI, the bucket count (HMGET meta n bits), the storage table when
    ``with_table``, an HGET per key (``fields``: the keys' 8-byte fields, in ``buckets``),
    EXEC, then ``tail`` (commands whose replies the read does not look at)."""
    hgets = [
        b"*3\r\n$4\r\nHGET\r\n$%d\r\n%b\r\n$8\r\n%b\r\n" % (len(name), name, field)
        for name, field in zip(buckets, fields, strict=True)
    ]
    head = [MULTI, command(b"HMGET", layout.key("m"), b"n", b"bits")]
    if with_table:
        head.append(command(b"HGETALL", layout.key("st")))
    return b"".join([*head, *hgets, EXEC, tail])


def bucket_count_of(reply: Sequence[bytes | None]) -> int:
    """The instance's bucket count from HMGET meta n bits (prelude.lua bucket_count)."""
    count, bits = reply
    return int(count) if count else 1 << int(bits or 0)


def blocked_storages(table: Mapping[bytes, bytes] | Sequence[bytes], servable: Sequence[str]) -> frozenset[int]:
    """The storage indexes (HGETALL of the storage table: ``#<index>`` -> name, a map in
    RESP3, a flat list in RESP2) whose storage may not serve."""
    allowed = {name.encode() for name in servable}
    pairs = table.items() if isinstance(table, Mapping) else zip(table[::2], table[1::2], strict=True)
    return frozenset(int(field[1:]) for field, name in pairs if field[:1] == b"#" and name not in allowed)


def serves(rec: bytes, blocked: frozenset[int]) -> bool:
    """Whether a record has a SERVING location on a storage that may serve."""
    if not blocked and rec[_FIRST_STATUS] == _SERVING:  # the usual record: one location
        return True
    for off in range(HEADER.size, HEADER.size + rec[_COUNT_AT] * LOCATION.size, LOCATION.size):
        if rec[off + _STATUS] == _SERVING and rec[off + _STORAGE] not in blocked:
            return True
    return False


@dataclass
class Answer:
    """What a read answers (per position, up to a prefix's end: the record, or None), and the
    records it served whose recency is due: their positions and new LFU counters."""

    records: list[bytes | None]
    due: list[int] = field(default_factory=list)
    lfu: bytearray = field(default_factory=bytearray)


@dataclass(frozen=True)
class Recency:
    """The recency rule: a served record's access time and LFU counter are refreshed at most
    once per ``interval_s``; the counter first loses one per ``decay_s`` since the last access
    (0: no decay), then gains one with probability 1 / (10 × (counter − LFU_INITIAL) + 1), as
    Redis's LFU (optimizer/kvcm_policy.py simulates the same)."""

    interval_s: int
    decay_s: int

    def counter(self, rec: bytes, now: int, rng: random.Random) -> int:
        """The LFU counter a refresh at ``now`` gives ``rec``."""
        lfu = rec[_LFU_AT]
        if self.decay_s > 0:
            lfu = max(lfu - (now - _U32.unpack_from(rec, _ATIME_AT)[0]) // self.decay_s, 0)
        if lfu < LFU_MAX and rng.random() < 1.0 / (max(lfu - LFU_INITIAL, 0) * 10 + 1):
            lfu += 1
        return lfu


def answer(
    found: Sequence[bytes | None],
    mode: int,
    sw_size: int,
    blocked: frozenset[int],
    covered: Sequence[bool] | None,
    now: int,
    recency: Recency,
    rng: random.Random,
) -> Answer:
    """The records a read serves, from what HGET found per key. Prefix mode stops at the
    first key neither served nor ``covered`` (a key served from elsewhere); window mode keeps
    the right-most ``sw_size`` consecutive such keys; batch mode keeps each served key; raw
    mode every stored record, served or not, and refreshes nothing. Served records whose
    access is due come back refreshed (as lua/touch.lua will store them)."""
    if mode == ReadMode.RAW:
        return Answer(list(found))
    ok: list[bytes | None] = [rec if rec is not None and serves(rec, blocked) else None for rec in found]
    if mode == ReadMode.PREFIX:
        for i, rec in enumerate(ok):
            if rec is None and not (covered and covered[i]):
                del ok[i:]
                break
    elif mode == ReadMode.WINDOW:
        window = rightmost_window(
            [rec is not None or bool(covered and covered[i]) for i, rec in enumerate(ok)], sw_size
        )
        ok = [rec if i in window else None for i, rec in enumerate(ok)]
    out = Answer(ok)
    stale = now - recency.interval_s
    stamp = _U32.pack(now)
    for i, rec in enumerate(ok):
        if rec is not None and _U32.unpack_from(rec, _ATIME_AT)[0] <= stale:
            lfu = recency.counter(rec, now, rng)
            ok[i] = rec[:_ATIME_AT] + stamp + bytes((lfu,)) + rec[_LFU_AT + 1 :]
            out.due.append(i)
            out.lfu.append(lfu)
    return out
