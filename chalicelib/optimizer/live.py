"""Live hit-ratio curves: fixed-size SHARDS over the hit feed (``observability.hit_feed``).

Upstream's online optimizer answers ``TraceQuery`` per instance at a few simulated
capacities (``capacity_gb[]``); here one :class:`LiveCurve` per instance keeps the
prefix-aware LRU curve at *every* capacity from the sampled reads and writes the instance
served, in memory bounded by ``s_max`` keys, and is saved between runs (:meth:`to_bytes`).

The feed is already spatially sampled (every key hashing under the feed's threshold), so
unlike ``shards.SampledCurveBuilder`` there is no exact top: every distance comes from the
sample. A write touches the keys it wrote and a read the keys it found (KVCM's reclaimer
orders by last access; a start writes only the keys the index lacks); a kept key's distance is ``1 + (c - 1) / R`` for
``c`` kept keys touched since it was, ``R = threshold / 2**32`` the rate now; a prefix
read hits a kept block at the running maximum of its request's kept distances and stops
at the first kept block never written (with prefix-chained keys, ``shards``' module doc).
When the sample would pass ``s_max`` keys the largest hash leaves and the threshold drops
to it (fixed-size SHARDS). Each kept hit stands for ``1 / R`` hits, ``R`` at the time of
the read. The blocks asked are counted exactly (the entries' ``n``); the sample's own
estimate of them (``1 / R`` per kept read) differs by what the sample drew of the few hot
blocks every request reads (system prompts: a 1/8 sample of 128 of them is 16 +- 4), and
SHARDS_adj adds that difference to the first bucket -- 0.08 of error down to under 0.01
on generated traces with shared system prompts (tests/unit/optimizer/test_live.py), where
scaling the hits by it (``shards``' ``ratio``) stays off by the whole 0.08.
"""

from __future__ import annotations

import base64
import bisect
import heapq
import json
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from ..observability.hit_feed import HASH_RANGE, KEYWISE, PREFIX, READ, FeedEntry, key_hash
from ..protocol.models import InstanceGroup
from .errors import ConfigError
from .instance_tuning import current_quotas, used_fraction
from .mrc import HitRatioCurve
from .shards import _SampleStack, capacity_edges
from .tuning import evaluate

#: Default bound of one instance's sample: about 0.01 error at the quota on generated
#: traces (tests/unit/optimizer/test_live.py); ~200 KB saved.
DEFAULT_LIVE_S_MAX = 8192
_FORMAT = 1
#: Shares of the reference quota the group view samples the curve at: 1/16 .. 4.
GRID = [2 ** (i / 8) for i in range(-32, 17)]
MARKS = {"x0.5": 0.5, "x1": 1.0, "x2": 2.0}
#: Sampled keys an instance's curve needs before it is read (``confident``). Under it the
#: sample misleads: SHARDS_adj credits its gap with the blocks asked as hits, and on a few
#: distinct keys that gap is mostly misses (5 reads of 64 keys, 3 of them written: 0.375
#: estimated, 0.047 served). Max error over a 40-point grid against the unsampled curve on
#: generated traces at rate 1/8, six seeds each: 0.07-0.25 at about 30 kept keys, 0.04-0.2 at
#: 60, 0.04-0.1 at 130 to 260, 0.04-0.07 at 500, 0.01-0.05 at 1,000 (docs/optimizer.md).
MIN_KEPT_KEYS = 512


def _edges(count: int) -> list[int]:
    """The first ``count`` bin capacities (``shards.capacity_edges`` from 0)."""
    edges = capacity_edges(0, exact=0)
    while len(edges) < count:
        edges = capacity_edges(edges[-1] * 2, exact=0)
    return edges[:count]


def _used(histogram: Sequence[float]) -> int:
    """The length of ``histogram`` without its trailing zeros."""
    used = len(histogram)
    while used and not histogram[used - 1]:
        used -= 1
    return used


def _pack(values: Sequence[int]) -> str:
    return base64.b64encode(struct.pack(f">{len(values)}q", *values)).decode()


def _unpack(text: str) -> list[int]:
    blob = base64.b64decode(text)
    return list(struct.unpack(f">{len(blob) // 8}q", blob))


class LiveCurve:
    """One instance's live curve: :meth:`feed` entries, :meth:`curve` the estimate."""

    def __init__(self, *, threshold: int, s_max: int = DEFAULT_LIVE_S_MAX, block_size: int = 1) -> None:
        if s_max < 1:
            raise ConfigError(f"s_max must be >= 1, got {s_max}")
        if not 0 < threshold <= HASH_RANGE:
            raise ConfigError(f"threshold must be in (0, 2**32], got {threshold}")
        self.s_max = s_max
        self.block_size = block_size
        self.threshold = threshold
        self._stack = _SampleStack()
        self._heap: list[tuple[int, int]] = []  # (-hash, key) of the sample's keys
        self._edges = _edges(1024)
        self._hits: list[float] = [0.0] * len(self._edges)  # estimated hit blocks by bin
        # estimated touches (a write's keys, a read's found ones) by distance bin, and of
        # keys no earlier touch put in the stack: what an LRU of any size inserts
        self._touches: list[float] = [0.0] * len(self._edges)
        self.first_touches = 0.0
        self.reads = 0  # read entries (reads with a sampled key)
        self.read_blocks = 0  # blocks asked (exact)
        self.sampled_read_blocks = 0.0  # the sample's estimate of them
        self.entries = 0  # entries fed

    @property
    def sample_rate(self) -> float:
        return self.threshold / HASH_RANGE

    @property
    def kept(self) -> int:
        return len(self._heap)

    def lower(self, threshold: int) -> None:
        """Keep only the keys hashing under ``threshold`` (the feed's rate went down)."""
        if threshold < self.threshold:
            self.threshold = threshold
            self._evict()

    def _evict(self) -> None:
        heap, stack = self._heap, self._stack
        while heap and -heap[0][0] >= self.threshold:
            stack.remove(heapq.heappop(heap)[1])

    def _admit(self, keys: Sequence[int]) -> list[int]:
        """``keys`` still in the sample after admitting the new ones, in order."""
        members, threshold = self._stack.members, self.threshold
        hashes = [key_hash(k) for k in keys]
        for key, hashed in zip(keys, hashes, strict=True):
            if hashed < self.threshold and key not in members:
                heapq.heappush(self._heap, (-hashed, key))
                members.add(key)
                if len(self._heap) > self.s_max:
                    self.threshold = -self._heap[0][0]
                    self._evict()
        if threshold == self.threshold:
            return [k for k, h in zip(keys, hashes, strict=True) if h < threshold]
        return [k for k in keys if k in members]

    def feed(self, entry: FeedEntry) -> None:
        """Account one feed entry."""
        self.entries += 1
        kept = self._admit(entry.keys)
        weight = HASH_RANGE / self.threshold
        if entry.op != READ:
            written = list(dict.fromkeys(kept))
            for key in written:
                count = self._stack.count_since(key)
                if count is None:
                    self.first_touches += weight
                else:
                    self._touch(1 + (count - 1) * weight, weight)
            self._stack.write(written)
            return
        self.reads += 1
        self.read_blocks += entry.asked
        self.sampled_read_blocks += weight * len(kept)
        stack = self._stack
        running = 0.0
        found: list[int] = []
        for key in kept:
            count = stack.count_since(key)
            if count is None:
                if entry.query == PREFIX:
                    break  # never cached: the request's hits end here
                continue
            distance = 1 + (count - 1) * weight
            if entry.query == KEYWISE:
                self._hit(distance, weight)
            else:
                running = max(running, distance)
                self._hit(running, weight)
            self._touch(distance, weight)
            found.append(key)
        # a read touches what it found (the reclaimer orders by last access): distances
        # are measured first, then the keys move to the top (the first one on top)
        stack.write(list(dict.fromkeys(found)))

    def _bin(self, distance: float) -> int:
        """The histograms' bin of ``distance``, the bins grown to hold it."""
        if distance > self._edges[-1]:
            self._edges = capacity_edges(distance * 2, exact=0)
            for histogram in (self._hits, self._touches):
                histogram.extend([0.0] * (len(self._edges) - len(histogram)))
        return bisect.bisect_left(self._edges, distance)

    def _hit(self, distance: float, weight: float) -> None:
        self._hits[self._bin(distance)] += weight

    def _touch(self, distance: float, weight: float) -> None:
        self._touches[self._bin(distance)] += weight

    @property
    def unique_keys(self) -> int:
        """Estimated distinct blocks written or found since the curve began."""
        return round(len(self._stack.last) / self.sample_rate)

    def evictions(self, capacity: int) -> int:
        """Estimated evictions of an LRU cache of ``capacity`` blocks over what was fed:
        its insertions (touches of keys out of its top ``capacity``) less what it holds."""
        beyond = sum(t for edge, t in zip(self._edges, self._touches, strict=True) if edge > capacity)
        return max(0, round(self.first_touches + beyond - min(capacity, self.unique_keys)))

    def curve(self) -> HitRatioCurve:
        """The estimated curve of everything fed (capacities in blocks)."""
        hits = list(self._hits)
        hits[1] += self.read_blocks - self.sampled_read_blocks  # SHARDS_adj, at distance 1
        cumulative: list[float] = []
        total = 0.0
        for value in hits:
            total += value  # a negative adjustment clamps at 0 until hits outweigh it
            cumulative.append(min(max(total, 0.0), float(self.read_blocks)))
        return HitRatioCurve.of_sampled_reads(
            block_size=self.block_size,
            sample_rate=self.sample_rate,
            reads=self.reads,
            read_blocks=self.read_blocks,
            hits=cumulative,
            edges=self._edges,
            kept_keys=self.kept,
            s_max=self.s_max,
        )

    # ------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        """The whole state, JSON-able: ``O(s_max)`` keys and the histogram."""
        stack = self._stack
        cached = sorted(stack.last, key=stack.last.__getitem__)  # oldest touch first
        hits = self._hits
        used = _used(hits)
        return {
            "format": _FORMAT,
            "s_max": self.s_max,
            "block_size": self.block_size,
            "threshold": self.threshold,
            "reads": self.reads,
            "read_blocks": self.read_blocks,
            "sampled_read_blocks": self.sampled_read_blocks,
            "entries": self.entries,
            "members": _pack(sorted(stack.members)),
            "stack": _pack(cached),
            "hits": hits[:used],
            "touches": self._touches[: _used(self._touches)],
            "first_touches": self.first_touches,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LiveCurve:
        if data.get("format") != _FORMAT:
            raise ConfigError(f"unknown live curve format {data.get('format')!r}")
        curve = cls(threshold=data["threshold"], s_max=data["s_max"], block_size=data["block_size"])
        curve.reads, curve.read_blocks, curve.entries = data["reads"], data["read_blocks"], data["entries"]
        curve.sampled_read_blocks = data["sampled_read_blocks"]
        members = _unpack(data["members"])
        curve._stack.members.update(members)
        curve._heap = [(-key_hash(k), k) for k in members]
        heapq.heapify(curve._heap)
        cached = _unpack(data["stack"])
        curve._stack.advance(len(cached))
        curve._stack.last.update((key, pos) for pos, key in enumerate(cached))
        hits = [float(h) for h in data["hits"]]
        touches = [float(t) for t in data.get("touches", [])]  # states saved before they were kept: none
        curve._edges = _edges(max(1024, len(hits), len(touches)))
        curve._hits = hits + [0.0] * (len(curve._edges) - len(hits))
        curve._touches = touches + [0.0] * (len(curve._edges) - len(touches))
        curve.first_touches = float(data.get("first_touches", 0.0))
        return curve

    def to_bytes(self) -> bytes:
        return zlib.compress(json.dumps(self.to_dict(), separators=(",", ":")).encode(), 6)

    @classmethod
    def from_bytes(cls, blob: bytes) -> LiveCurve:
        return cls.from_dict(json.loads(zlib.decompress(blob)))


def live_curves_of(state: Mapping[str, Any]) -> dict[str, LiveCurve]:
    """Every instance's live curve in a saved group state."""
    return {name: LiveCurve.from_dict(data) for name, data in state.get("instances", {}).items()}


def curves_of(state: Mapping[str, Any]) -> dict[str, HitRatioCurve]:
    """Every instance's curve in a saved group state."""
    return {name: live.curve() for name, live in live_curves_of(state).items()}


def group_view(
    group: InstanceGroup,
    live: Mapping[str, LiveCurve],
    block_bytes: Mapping[str, int],
) -> dict[str, Any]:
    """The group's curve against its quota in bytes: every instance's quota scaled by the
    same share (their current split, the tuning job's ``current_quotas``), the group's hit
    ratio the read blocks' weighted mean. Without a quota, the shares are of the bytes
    that would hold every instance's whole curve (``reference_bytes``). The group's curve is
    ``confident`` once each of its instances' samples holds ``MIN_KEPT_KEYS`` keys. Per
    instance, at the capacity it keeps under its share: upstream's instance summary's
    ``peak_unique_keys`` (what that LRU held at most: it never drops a block but to make
    room) and ``eviction_count``, estimated from the sample."""
    curves = {n: c.curve() for n, c in live.items()}
    names = sorted(n for n in curves if block_bytes.get(n, 0) > 0 and curves[n].read_blocks)
    quota = group.quota.capacity if group.quota is not None else 0
    used = used_fraction(group)
    if quota > 0:
        split = current_quotas(group, names) if names else {}
    else:
        split = {n: int(curves[n].saturation_capacity / used) * block_bytes[n] for n in names}
    reference = sum(split.values())

    def ratio(share: float) -> float | None:
        if not names or reference <= 0:
            return None
        quotas = {n: int(q * share) for n, q in split.items()}
        return evaluate({n: curves[n] for n in names}, quotas, used_fraction=used, block_bytes=block_bytes).hit_ratio

    capacity = {n: int(split.get(n, 0) * used / block_bytes[n]) for n in names}
    return {
        "quota_bytes": quota,
        "reference_bytes": reference,
        "used_percentage": used,
        "confident": bool(names) and all(curves[n].kept_keys >= MIN_KEPT_KEYS for n in names),
        "min_kept_keys": MIN_KEPT_KEYS,
        "points": [{"quota_bytes": int(reference * s), "hit_ratio": ratio(s)} for s in GRID],
        "at_quota": {mark: ratio(share) if quota > 0 else None for mark, share in MARKS.items()},
        "instances": {
            n: {
                "hit_ratio": curves[n].block_hit_ratio(capacity[n]),
                "read_blocks": curves[n].read_blocks,
                "reads": curves[n].reads,
                "sample_rate": curves[n].sample_rate,
                "kept_keys": curves[n].kept_keys,
                "confident": curves[n].kept_keys >= MIN_KEPT_KEYS,
                "unique_keys": live[n].unique_keys,
                "capacity_blocks": capacity[n],
                "peak_unique_keys": min(capacity[n], live[n].unique_keys),
                "eviction_count": live[n].evictions(capacity[n]),
                "block_bytes": block_bytes[n],
                "quota_bytes": split.get(n, 0),
            }
            for n in names
        },
    }
