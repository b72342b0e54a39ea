"""The hit feed: a spatially sampled, bounded record of the reads and writes each instance
serves, for the live hit-ratio curves (``optimizer.live``, the ``hit_curves`` schedule).

A block key is in the feed iff ``key_hash(key) < threshold`` (rate ``threshold / 2**32``):
the same keys every call, every container, so the stack distances of the kept keys are
those of a SHARDS sample (Waldspurger et al., FAST '15). The decision is made in Python
before the call; a call none of whose keys is sampled adds nothing, a sampled one adds an
``XADD ... MAXLEN ~`` to the pipeline of the Valkey call it makes anyway (the read's
script, the start's group-usage update): no extra round trip.

An entry (one stream message) has fields ``o`` (``r`` read, ``w`` write), ``q`` (``p``
prefix match: the hits end at the first miss, ``b`` key by key), ``k`` (the sampled keys
of the read's unmasked keys or of the keys a start wrote, in request order, 8 bytes each,
big-endian signed), ``t`` (the call's time, ms: the stream's own ids are the server's
clock) and, for a read, ``n``: the blocks asked by this container's reads of
the instance since its last read entry, this one included. The curve needs that exact
count (SHARDS_adj: the difference between it and the sample's estimate goes to the first
bucket, what corrects a sample drawing too few or too many of the few hot blocks), and a
read without a sampled key still needs no entry: its blocks ride on the next one.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..clock import Clock, SystemClock

HASH_BITS = 32
HASH_RANGE = 1 << HASH_BITS
_MASK = HASH_RANGE - 1
_SALT = 0x2F6B_3C1D  # mixes small sequential ids; int/tuple hashing is not randomized per process
#: The stream's suffix under an instance's key prefix (same slot as its index keys).
STREAM_SUFFIX = "hf"
READ, WRITE = b"r", b"w"
PREFIX, KEYWISE = b"p", b"b"


def key_hash(key: int) -> int:
    """The key's sampling hash in ``[0, 2**32)``: the same in every process."""
    return hash((key, _SALT)) & _MASK


def threshold_of(rate: float) -> int:
    """The hash threshold of a sampling ``rate`` in ``(0, 1]``."""
    return max(1, min(HASH_RANGE, int(rate * HASH_RANGE)))


def pack_keys(keys: Sequence[int]) -> bytes:
    return struct.pack(f">{len(keys)}q", *keys)


def unpack_keys(blob: bytes) -> list[int]:
    return list(struct.unpack(f">{len(blob) // 8}q", blob))


@dataclass(frozen=True)
class FeedEntry:
    """One sampled call: what ``XADD`` appends to the instance's stream."""

    op: bytes
    query: bytes
    keys: list[int]
    asked: int = 0  # reads: blocks asked since the container's last read entry
    time_ms: int = 0
    max_len: int = 0  # the stream's approximate bound when it is appended (0: none)

    def fields(self) -> dict[bytes, bytes]:
        return {
            b"o": self.op,
            b"q": self.query,
            b"k": pack_keys(self.keys),
            b"n": b"%d" % self.asked,
            b"t": b"%d" % self.time_ms,
        }

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes]) -> FeedEntry:
        return cls(fields[b"o"], fields[b"q"], unpack_keys(fields[b"k"]), int(fields[b"n"]), int(fields[b"t"]))


@dataclass
class HitFeed:
    """The feed's sampling (``threshold``, 0: off), each stream's approximate bound, and
    the blocks this container's reads asked since each instance's last read entry."""

    threshold: int
    max_len: int
    clock: Clock = field(default_factory=SystemClock)
    _unsent: dict[str, int] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def enabled(self) -> bool:
        return self.threshold > 0

    def _now_ms(self) -> int:
        return int(self.clock.now() * 1000)

    def sampled(self, keys: Iterable[int]) -> list[int]:
        threshold = self.threshold
        return [k for k in keys if hash((k, _SALT)) & _MASK < threshold]

    def read(self, instance_id: str, query: bytes, keys: Sequence[int]) -> FeedEntry | None:
        """A read's entry, or None when none of its keys is sampled (its blocks asked are
        kept for the next entry)."""
        if not self.threshold:
            return None
        kept = self.sampled(keys)
        with self._lock:
            asked = self._unsent.pop(instance_id, 0) + len(keys)
            if not kept:
                self._unsent[instance_id] = asked
                return None
        return FeedEntry(READ, query, kept, asked, self._now_ms(), self.max_len)

    def write(self, keys: Iterable[int]) -> FeedEntry | None:
        """The entry of a start that wrote ``keys``, or None when none is sampled."""
        kept = self.sampled(keys) if self.threshold else []
        return FeedEntry(WRITE, PREFIX, kept, 0, self._now_ms(), self.max_len) if kept else None


def off() -> HitFeed:
    """A feed that records nothing."""
    return HitFeed(0, 0)
