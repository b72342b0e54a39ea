"""Reading candidates from the index at a cost bounded by the sample, not the instance.

Block keys are hashes and buckets hold the keys' low bits, so the records of a few random
buckets are a uniform sample of an instance's blocks. A round reads whole buckets
(about 16 records each, as they grow: BlockIndex.RECORDS_PER_BUCKET), several per round trip, and never scans the
instance. Buckets are drawn from the instance's occupied-bucket set, so a sparse instance
sized for millions of buckets is sampled as cheaply as a full one; TTL expiry walks a
cursor over that set instead, so every block is looked at once per pass.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..index import BlockIndex, InstanceLayout, Status
from ..index.layout import HEADER, LOCATION, RecordFlag
from ..index.records import location_id_at, location_offsets
from ..index.types import MODE_RAW
from .policies import Candidate


@dataclass(frozen=True)
class SamplingConfig:
    """Bounds of one instance's work in one round."""

    #: Candidates gathered per victim needed: each victim is the worst of about this many.
    oversample: int = 5
    #: At most this many candidates in the pool.
    max_pool: int = 4096
    #: Buckets read per round trip.
    buckets_per_trip: int = 32
    #: Random buckets read per instance and round, at most.
    max_buckets: int = 512
    #: Victims per instance and round, at most (the rest waits for the next round).
    max_victims: int = 8192
    #: Victims marked per index call.
    mark_batch: int = 1024
    #: Buckets the TTL sweep reads per instance and check: at least / at most.
    min_sweep_buckets: int = 16
    max_sweep_buckets: int = 512


def sweep_buckets(bucket_count: int, period_s: int, ttl_s: int, config: SamplingConfig) -> int:
    """Buckets to sweep per check, so that one pass over the instance takes about
    ``ttl_s`` when checks come every ``period_s`` (bounded by the config)."""
    wanted = math.ceil(bucket_count * max(1, period_s) / max(1, ttl_s))
    return min(bucket_count, config.max_sweep_buckets, max(config.min_sweep_buckets, wanted))


@dataclass(frozen=True)
class Coverage:
    """Which copies keep a block readable without one of its locations: a SERVING copy on
    another storage that may serve now (``servable``) whose spec group holds every spec of
    the location's (``table``: ``cache.service.spec_group_coverage``, ``groups`` of them)."""

    servable: frozenset[str]
    table: bytes
    groups: int

    def covers(self, wanted_group: int, held_group: int) -> bool:
        if wanted_group >= self.groups or held_group >= self.groups:
            return wanted_group == held_group
        return self.table[wanted_group * self.groups + held_group] == ord("1")


_STATUS_AT = LOCATION.offset("status")
_STORAGE_AT = LOCATION.offset("storage_index")
_SPEC_GROUP_AT = LOCATION.offset("spec_group")


def to_candidate(
    block_key: int,
    raw: bytes,
    storages: Mapping[int, tuple[str, str]],
    sizes: Sequence[int],
    storage_name: str = "",
    instance_id: str = "",
    absent_from: str = "",
    prefer_types: frozenset[str] = frozenset(),
    coverage: Coverage | None = None,
    idle_only: bool = False,
) -> Candidate | None:
    """The candidate a record offers: its first SERVING location (on ``storage_name`` when
    given; of a type in ``prefer_types`` when it has one: a type over its quota is reclaimed
    whatever other copies it has), or None. WRITING and DELETING locations are never
    candidates. With ``absent_from``, a record holding any location on that storage (a copy
    there, or one being made: its WRITING target) offers none; with ``idle_only``, nor does
    one holding a WRITING location anywhere (a write or a Copy running: a Copy's target
    fails when its source changes). With ``coverage``, the
    candidate says whether another copy keeps the block readable without it (``covered``)."""
    # Thousands of records per round: read the few bytes needed rather than decode it all.
    offsets = location_offsets(raw)
    named = [storages.get(raw[off + _STORAGE_AT], ("", "")) for off in offsets]
    if absent_from and any(name == absent_from for name, _ in named):
        return None
    if idle_only and any(raw[off + _STATUS_AT] == Status.WRITING for off in offsets):
        return None
    serving = [n for n, off in enumerate(offsets) if raw[off + _STATUS_AT] == Status.SERVING]
    offered = [n for n in serving if not storage_name or named[n][0] == storage_name]
    if not offered:
        return None
    chosen = next((n for n in offered if named[n][1] in prefer_types), offered[0])
    off = offsets[chosen]
    name, storage_type = named[chosen]
    spec_group = raw[off + _SPEC_GROUP_AT]
    covered = coverage is not None and any(
        n != chosen
        and named[n][0] != name
        and named[n][0] in coverage.servable
        and coverage.covers(spec_group, raw[offsets[n] + _SPEC_GROUP_AT])
        for n in serving
    )
    flags, parent, children, last_access_s, lfu, _, _ = HEADER.unpack_from(raw)
    return Candidate(
        block_key,
        location_id_at(raw, off),
        int.from_bytes(parent, "big", signed=True) if flags & RecordFlag.HAS_PARENT else None,
        children,
        last_access_s,
        lfu,
        sizes[spec_group] if spec_group < len(sizes) else sizes[0],
        storage_type,
        children,
        instance_id,
        covered,
        name,
    )


class BucketSampler:
    """Candidates of one instance, read bucket by bucket. Never reads a bucket twice."""

    def __init__(
        self,
        index: BlockIndex,
        layout: InstanceLayout,
        storages: Mapping[int, tuple[str, str]],
        sizes: Sequence[int],
        rng: random.Random,
        config: SamplingConfig,
        storage_name: str = "",
        absent_from: str = "",
        prefer_types: frozenset[str] = frozenset(),
        coverage: Coverage | None = None,
        idle_only: bool = False,
    ) -> None:
        self.index = index
        self.layout = layout
        self.storages = storages
        self.sizes = sizes
        self.rng = rng
        self.config = config
        self.storage_name = storage_name
        self.absent_from = absent_from
        self.prefer_types = prefer_types
        self.coverage = coverage
        self.idle_only = idle_only
        self._seen: set[int] = set()
        self._sampled = 0
        #: Buckets read so far (sampled and swept).
        self.buckets_read = 0
        # Up to ``max_buckets`` distinct occupied buckets (all of them when fewer), drawn
        # once by the server and shuffled by the rng: the round's sample, in order.
        self._order: list[int] = []
        self._occupied: int | None = None

    def _count(self) -> int:
        if self._occupied is None:
            self._occupied, members = self.index.occupied_sample(self.layout, self.config.max_buckets)
            self._order = sorted(members)
            self.rng.shuffle(self._order)
        return self._occupied

    @property
    def occupied(self) -> int:
        """How many buckets of the instance hold records."""
        return self._count()

    @property
    def exhausted(self) -> bool:
        """No random bucket left to read this round."""
        return self._sampled >= self.config.max_buckets or len(self._seen) >= self._count()

    def _read(self, buckets: list[int]) -> list[Candidate]:
        self._seen.update(buckets)
        self.buckets_read += len(buckets)
        entries = self.index.read_buckets(self.layout, buckets)
        return [c for c in (self.candidate(key, raw) for key, raw in entries) if c is not None]

    @property
    def sampled(self) -> int:
        """Random buckets read so far."""
        return self._sampled

    def sample(self, buckets: int) -> list[Candidate]:
        """The candidates of ``buckets`` random, unread buckets (at most one round trip's
        worth and what the budget has left)."""
        count = self._count()
        wanted = min(
            max(1, buckets),
            self.config.buckets_per_trip,
            self.config.max_buckets - self._sampled,
            count - len(self._seen),
        )
        if wanted <= 0:
            return []
        picks = [b for b in self._order if b not in self._seen][:wanted]
        if not picks:
            # Nothing unread left to draw (the set changed meanwhile): done for this round.
            self._sampled = self.config.max_buckets
            return []
        self._sampled += len(picks)
        return self._read(picks)

    def sweep(self, buckets: int) -> list[Candidate]:
        """The candidates of the next ``buckets`` buckets of the instance's sweep cursor."""
        window = self.index.advance_sweep(self.layout, buckets)
        step = self.config.buckets_per_trip
        return [c for i in range(0, len(window), step) for c in self._read(window[i : i + step])]

    def reread(self, block_keys: Sequence[int]) -> dict[int, bytes | None]:
        """Current raw records of ``block_keys`` (None = gone), one round trip, no touch."""
        return dict(zip(block_keys, self.index.read_raw(self.layout, list(block_keys), MODE_RAW), strict=True))

    def candidate(self, block_key: int, raw: bytes) -> Candidate | None:
        """``to_candidate`` with this instance's storages and sizes."""
        return to_candidate(
            block_key,
            raw,
            self.storages,
            self.sizes,
            self.storage_name,
            self.layout.instance_id,
            self.absent_from,
            self.prefer_types,
            self.coverage,
            self.idle_only,
        )
