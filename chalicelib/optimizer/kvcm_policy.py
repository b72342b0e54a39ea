"""The eviction policy KVCM runs, simulated: ``make_policy("kvcm", ...)``.

The live reclaimer (``chalicelib/capacity``) does not evict the globally worst block. It
mirrors, block for block where it can:

* **Records.** A block written gets its last access (whole seconds) and an LFU counter of
  5; a served read refreshes both at most once per ``touch_interval_s`` per block (the LFU
  counter decays by one per ``lfu_decay_s`` idle, then grows with probability
  ``1 / (10 * (counter - 5) + 1)``, as index/reads.py ``Recency``). A write never refreshes a block that
  exists.
* **Limits.** The capacity given to the replay is the instance's hard limit (KVCM's
  ``max_key_count``, or its byte quota in blocks). A write whose new blocks would pass it
  makes room first: up to ``MAKE_ROOM_ATTEMPTS`` times (``FRUITLESS_ATTEMPTS`` that free
  nothing end it), the write path evicts (bounded sampling, never the write's own keys)
  the shortfall (plus ``headroom_percent`` of the limit, 0 as the service), and the
  write is tried again; still over, it gets the longest leading run of its new blocks
  that fits (a partial grant), refused and waking the reclaimer when none fits
  (cache/room.py, capacity/eviction.py).
* **Rounds.** A round runs every ``round_s`` (the scheduler: 1 s locally, 60 s on AWS);
  it looks at the instance when woken, when the last round freed something while over,
  or ``period_s`` after its last look. It frees what is over ``used_percentage`` of the
  limit, at most ``step_percentage`` of it (under pressure, a woken look also keeps one
  step, at most 10 %, free under the limit).
* **Victims.** Blocks live in buckets by their key's low bits, which grow with the blocks
  as the index's do (16 at first, a split as the blocks pass 8 per bucket:
  ``chalicelib.index.block_index.bucket_index``). Whole random buckets are read until the
  pool holds ``oversample`` leaf candidates per block needed (capped); the policy's worst
  fifth of the pool goes at a time; a victim's parent left without children joins the
  pool. Order: ``lru`` (last
  access), ``lfu`` (decayed counter) or ``ttl`` (expiry; expired blocks go whatever the
  watermark, found by a sweep of ``sweep`` buckets per look). Ties: last access, then key.

The constants default to the live ones (a unit test compares them with
``chalicelib.capacity``). Randomness comes from the policy's seeded RNG.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from chalicelib.index.block_index import BlockIndex
from chalicelib.index.layout import MAX_BUCKETS, MAX_SPLITS_PER_CALL
from chalicelib.index.types import FIRST_BUCKET_BITS, bucket_index
from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.policy_base import EvictionPolicy

#: A new record's LFU counter and the counter's ceiling (lua/start.lua, index/reads.py).
LFU_INITIAL, LFU_MAX = 5, 255
#: Under pressure the trigger keeps one step, at most this % of the limit, free.
PRESSURE_HEADROOM_PERCENT = 10
#: Times a refused write makes room and tries again (cache/service.py); it gives up after
#: this many attempts that freed nothing.
MAKE_ROOM_ATTEMPTS = 10
FRUITLESS_ATTEMPTS = 3
MIN_DENSITY = 0.01
ORDERS = ("lru", "lfu", "ttl")


@dataclass(frozen=True)
class Sampling:
    """Bounds of one eviction's sampling (``chalicelib.capacity.sampling.SamplingConfig``)."""

    oversample: int = 5
    max_pool: int = 4096
    buckets_per_trip: int = 32
    max_buckets: int = 512
    max_victims: int = 8192
    mark_batch: int = 1024
    min_sweep_buckets: int = 16
    max_sweep_buckets: int = 512


ROUND_SAMPLING = Sampling()
#: The write path's bounds (chalicelib.capacity.eviction.WRITE_PATH_SAMPLING).
WRITE_PATH_SAMPLING = Sampling(max_buckets=256, max_victims=20_000, buckets_per_trip=64)


class _Block:
    __slots__ = ("atime", "lfu", "parent")

    def __init__(self, atime: int, parent: int | None) -> None:
        self.atime = atime
        self.lfu = LFU_INITIAL
        self.parent = parent


class KVCMPolicy(EvictionPolicy):
    """KVCM's reclaimer and write-path eviction over one instance (module docstring)."""

    name = "kvcm"
    timed = True
    uses_parents = True
    refresh_on_write = False
    watermark_simulated = True

    def __init__(
        self,
        seed: int = 0,
        order: str = "lru",
        ttl_s: int = 0,
        used_percentage: float = 0.9,
        step_percentage: int = 10,
        period_s: int = 10,
        round_s: float = 60.0,
        touch_interval_s: int = 1,
        lfu_decay_s: int = 60,
        headroom_percent: int = 0,
        write_path_victims_move: bool = False,
    ) -> None:
        if order not in ORDERS:
            raise ConfigError(f"kvcm order must be one of {', '.join(ORDERS)}, got {order!r}")
        if not used_percentage > 0 or not 0 < step_percentage <= 100:
            raise ConfigError("kvcm needs used_percentage > 0 and step_percentage in (0, 100]")
        if period_s < 1 or not round_s > 0 or ttl_s < 0:
            raise ConfigError("kvcm needs period_s >= 1, round_s > 0 and ttl_s >= 0")
        self._rng = random.Random(seed)
        self.order, self.ttl_s = order, ttl_s
        self.used_fraction, self.step_percentage = used_percentage, step_percentage
        self.period_s, self.round_s = period_s, round_s
        self.touch_interval_s, self.lfu_decay_s = touch_interval_s, lfu_decay_s
        self.headroom_percent = headroom_percent
        self.write_path_victims_move = write_path_victims_move
        self._entries: dict[int, _Block] = {}
        # cached children per parent key, whether the parent is cached or not: a block
        # stored after its child (a tier receiving demoted blocks, coldest first) is no leaf
        self._children: dict[int, int] = {}
        # the children that keep a block from being dropped: in a tiered cache, those every
        # kvcm tier holds (KVCM's record counts its children whatever their tier), so a
        # drop never cuts a prefix another tier continues (``share_children``)
        self._drop_children = self._children
        #: This tier's round victims move on (a tiered cache's demoting tier): a round may
        #: then take a block whose children another tier holds.
        self.hands_on = False
        self._buckets: dict[int, set[int]] = {}
        self._bucket_count = 1 << FIRST_BUCKET_BITS
        self._limit: int | None = None
        self._now = 0.0
        self._next_tick: float | None = None
        self._next_check = -math.inf
        self._next_sweep = -math.inf
        self._sweep_cursor = 0
        self._over = self._woken = False
        self.refused_writes = 0
        self.evicted = {"round": 0, "write_path": 0}

    # ------------------------------------------------------------ time and limits

    def advance(self, timestamp_us: int) -> None:
        """Move the clock to ``timestamp_us``, running the rounds due on the way."""
        now = timestamp_us / 1e6
        if self._next_tick is None:
            self._next_tick = math.floor(now / self.round_s) * self.round_s + self.round_s
        while self._next_tick <= now:
            self._now = self._next_tick
            self._round()
            self._next_tick += self.round_s
        self._now = now

    def _set_limit(self, limit: int | None) -> None:
        if limit is None:
            raise ConfigError("the kvcm policy needs a per-instance capacity (mode instance_precise)")
        if self._limit is None:
            self._limit = limit

    def _trigger(self, pressure: bool) -> tuple[int, int]:
        """(trigger, step) of a round over the limit (capacity/watermark.py)."""
        limit = self._limit or 0
        step = max(1, math.ceil(limit * self.step_percentage / 100))
        trigger = math.floor(round(limit * self.used_fraction, 6))
        if pressure and self.used_fraction <= 1:
            ceiling = limit - min(step, math.ceil(limit * PRESSURE_HEADROOM_PERCENT / 100))
            trigger = min(trigger, ceiling)
        return trigger, step

    def _round(self) -> None:
        """One reclaimer round's look at this instance, if it is due."""
        if self._limit is None:
            return
        woken, self._woken = self._woken, False
        if not (woken or self._over or self._now >= self._next_check):
            return
        self._next_check = self._now + self.period_s
        trigger, step = self._trigger(pressure=woken)
        need = min(max(0, len(self._entries) - trigger), step)
        sweeping = self.order == "ttl" and self.ttl_s > 0 and self._now >= self._next_sweep
        if need == 0 and not sweeping:
            self._over = False
            return
        if sweeping:
            self._next_sweep = self._now + self.period_s
        freed = self._evict(need, ROUND_SAMPLING, len(self._entries), sweeping, dropping=not self.hands_on)
        self.evicted["round"] += freed
        self._over = need > 0 and freed > 0

    # ------------------------------------------------------------ the data path

    def touch(self, keys: Sequence[int]) -> None:
        """A served read: refresh at most once per touch interval per block."""
        now = int(self._now)
        stale = now - self.touch_interval_s
        entries = self._entries
        for key in keys:
            block = entries.get(key)
            if block is None or block.atime > stale:
                continue
            lfu = block.lfu
            if self.lfu_decay_s > 0:
                lfu = max(0, lfu - (now - block.atime) // self.lfu_decay_s)
            if lfu < LFU_MAX and self._rng.random() < 1.0 / (max(0, lfu - LFU_INITIAL) * 10 + 1):
                lfu += 1
            block.atime, block.lfu = now, lfu

    def insert(self, keys: Sequence[int], limit: int | None = None, parent: int | None = None) -> int:
        """A start + finish of ``keys``: the leading run of new blocks that fits the limit."""
        self._set_limit(limit)
        entries = self._entries
        new: dict[int, int | None] = {}
        for index, key in enumerate(keys):
            if key not in entries and key not in new:
                new[key] = keys[index - 1] if index else parent
        if not new:
            return 0
        fit = self._make_room(len(new), frozenset(keys))
        if not fit:
            self.refused_writes += 1
            self._woken = True
            return 0
        if fit < len(new):  # a partial grant: the leading run of the new blocks
            new = dict(list(new.items())[:fit])
        now = int(self._now)
        for key, key_parent in new.items():
            entries[key] = _Block(now, key_parent)
            bucket = bucket_index(key, self._bucket_count)
            members = self._buckets.get(bucket)
            if members is None:
                members = self._buckets[bucket] = set()
            members.add(key)
            if key_parent is not None:
                self._children[key_parent] = self._children.get(key_parent, 0) + 1
                if self._drop_children is not self._children:
                    self._drop_children[key_parent] = self._drop_children.get(key_parent, 0) + 1
        self._grow()
        return len(new)

    def _grow(self) -> None:
        """Split buckets as a start does (lua/prelude.lua grow_buckets)."""
        splits = 0
        while (
            len(self._entries) > BlockIndex.RECORDS_PER_BUCKET * self._bucket_count
            and self._bucket_count < MAX_BUCKETS
            and splits < MAX_SPLITS_PER_CALL
        ):
            new = self._bucket_count
            source = new - (1 << (new.bit_length() - 1))
            members = self._buckets.get(source, set())
            moved = {k for k in members if bucket_index(k, new + 1) == new}
            if moved:
                members -= moved
                self._buckets[new] = moved
                if not members:
                    del self._buckets[source]
            self._bucket_count, splits = new + 1, splits + 1

    def _make_room(self, new: int, protected: frozenset[int]) -> int:
        """How many of ``new`` blocks fit (a leading run), after the write path made room
        if it had to."""
        limit = self._limit or 0
        headroom = math.floor(limit * self.headroom_percent / 100)
        fruitless = 0
        for _ in range(MAKE_ROOM_ATTEMPTS):
            over = len(self._entries) + new - limit
            if over <= 0:
                return new
            if self.used_fraction > 1:
                return 0  # a used_percentage over 1: full groups refuse, as upstream
            moves = self.write_path_victims_move
            freed = self._evict(
                over + headroom,
                WRITE_PATH_SAMPLING,
                0,
                False,
                protected,
                record=moves,
                dropping=not (moves and self.hands_on),
            )
            self.evicted["write_path"] += freed
            fruitless += freed == 0
            if fruitless == FRUITLESS_ATTEMPTS or freed < over:
                break
        return max(0, min(new, limit - len(self._entries)))

    def evict(self, count: int) -> int:
        """``count`` victims chosen as a round chooses them."""
        return self._evict(count, ROUND_SAMPLING, len(self._entries), False, dropping=not self.hands_on)

    # ------------------------------------------------------------ victims

    def _score(self, key: int) -> tuple[int, int, int]:
        block = self._entries[key]
        if self.order == "lfu":
            score = block.lfu
            if self.lfu_decay_s > 0:
                score = max(0, block.lfu - max(0, int(self._now) - block.atime) // self.lfu_decay_s)
        elif self.order == "ttl":
            score = block.atime + self.ttl_s
        else:
            score = block.atime
        return score, block.atime, key

    def _expired(self, key: int) -> bool:
        return self.order == "ttl" and self.ttl_s > 0 and int(self._now) - self._entries[key].atime > self.ttl_s

    def _evict(
        self,
        need: int,
        sampling: Sampling,
        blocks_hint: int,
        sweep: bool,
        protected: frozenset[int] = frozenset(),
        record: bool = True,
        dropping: bool = True,
    ) -> int:
        """Free ``need`` blocks (and, sweeping, the expired ones), never ``protected`` ones,
        as ``capacity.instance.InstanceReclaim`` does; returns how many were freed.
        ``record``: the victims go to the recorded victims (a tiered replay moves those).
        ``dropping``: the victims leave the cache, so leaves are judged by the children of
        every tier (``share_children``), else by this tier's."""
        sampler = _Sampler(self, sampling, protected, dropping)
        pool: set[int] = set()
        if sweep:
            pool |= sampler.sweep()
        admitted = 0
        freed = 0
        while freed < sampling.max_victims:
            if need > 0:
                wanted = min(sampling.max_pool, sampling.oversample * max(1, need))
                while len(pool) < wanted and not sampler.exhausted:
                    density = admitted / sampler.sampled if sampler.sampled else blocks_hint / max(1, sampler.occupied)
                    before = len(pool)
                    pool |= sampler.sample(math.ceil((wanted - before) / max(density, MIN_DENSITY)))
                    admitted += len(pool) - before
            worst = max(1, len(pool) // sampling.oversample)
            limit = min(sampling.mark_batch, sampling.max_victims - freed)
            picked = self._pick(pool, need, limit, worst)
            if not picked:
                break
            pool.difference_update(picked)
            for key in picked:
                need = max(0, need - 1)
                parent = self._drop(key, record, dropping)
                if parent is not None and parent not in protected:
                    pool.add(parent)
            freed += len(picked)
        return freed

    def _pick(self, pool: set[int], need: int, limit: int, need_limit: int) -> list[int]:
        """Expired candidates first, then the worst ones while ``need`` lasts."""
        ordered = sorted(pool, key=self._score)
        picked = [k for k in ordered if self._expired(k)][:limit]
        chosen = set(picked)
        remaining = max(0, need - len(picked))
        by_need = 0
        for key in ordered:
            if len(picked) >= limit or by_need >= need_limit or remaining <= 0:
                break
            if key in chosen:
                continue
            picked.append(key)
            remaining -= 1
            by_need += 1
        return picked

    def _drop(self, key: int, record: bool = True, dropping: bool = True) -> int | None:
        """Remove a victim; returns its parent when that parent became a cached leaf
        (judged as ``_evict``'s ``dropping`` says)."""
        block = self._entries.pop(key)
        if record and self._victims is not None:
            self._victims.append(key)
        bucket = bucket_index(key, self._bucket_count)
        members = self._buckets[bucket]
        members.discard(key)
        if not members:
            del self._buckets[bucket]
        parent = block.parent
        if parent is None:
            return None
        leaf = _release(self._children, parent)
        if self._drop_children is not self._children:
            shared_leaf = _release(self._drop_children, parent)
            leaf = shared_leaf if dropping else leaf
        return parent if leaf and parent in self._entries else None

    def share_children(self, counts: dict[int, int]) -> None:
        """Count this tier's children also in ``counts``, shared by the tiers of a tiered
        cache; a block this tier drops must have none there."""
        self._drop_children = counts

    def leaves(self, keys: Sequence[int], dropping: bool = True) -> list[int]:
        """The cached leaves among ``keys`` (candidates: no cached child; ``dropping``: in
        no tier)."""
        entries, children = self._entries, self._drop_children if dropping else self._children
        return [k for k in keys if k in entries and k not in children]


def _release(counts: dict[int, int], parent: int) -> bool:
    """One child of ``parent`` fewer in ``counts``; whether it has none left."""
    left = counts[parent] - 1
    if left:
        counts[parent] = left
        return False
    del counts[parent]
    return True


class _Sampler:
    """Whole buckets of one instance, never one twice per eviction
    (``capacity.sampling.BucketSampler``)."""

    def __init__(
        self, policy: KVCMPolicy, sampling: Sampling, protected: frozenset[int] = frozenset(), dropping: bool = True
    ) -> None:
        self.policy = policy
        self.sampling = sampling
        self.protected = protected
        self.dropping = dropping
        self.seen: set[int] = set()
        self.sampled = 0
        self.occupied = len(policy._buckets)
        self._order: list[int] | None = None
        if self.occupied <= sampling.max_buckets:
            self._order = sorted(policy._buckets)
            policy._rng.shuffle(self._order)

    @property
    def exhausted(self) -> bool:
        return self.sampled >= self.sampling.max_buckets or len(self.seen) >= self.occupied

    def _read(self, buckets: list[int]) -> set[int]:
        self.seen.update(buckets)
        members = self.policy._buckets
        keys = [k for b in buckets for k in members.get(b, ()) if k not in self.protected]
        return set(self.policy.leaves(keys, self.dropping))

    def sample(self, buckets: int) -> set[int]:
        wanted = min(
            max(1, buckets),
            self.sampling.buckets_per_trip,
            self.sampling.max_buckets - self.sampled,
            self.occupied - len(self.seen),
        )
        if wanted <= 0:
            return set()
        if self._order is not None:
            picks = [b for b in self._order if b not in self.seen][:wanted]
        else:
            occupied = list(self.policy._buckets)
            draws = self.policy._rng.sample(occupied, min(len(occupied), 2 * wanted))
            picks = [b for b in draws if b not in self.seen][:wanted]
            if not picks:
                self.sampled = self.sampling.max_buckets
                return set()
        self.sampled += len(picks)
        return self._read(picks)

    def sweep(self) -> set[int]:
        """The next buckets of the TTL sweep's cursor (one pass about every ``ttl_s``)."""
        policy = self.policy
        count = min(
            self.occupied,
            self.sampling.max_sweep_buckets,
            max(self.sampling.min_sweep_buckets, math.ceil(self.occupied * policy.period_s / max(1, policy.ttl_s))),
        )
        occupied = sorted(policy._buckets)
        if not occupied:
            return set()
        start = policy._sweep_cursor % len(occupied)
        window = [occupied[(start + i) % len(occupied)] for i in range(min(count, len(occupied)))]
        policy._sweep_cursor = start + len(window)
        return self._read(window)
