"""Tiered replay: every instance keeps its blocks on several tiers, fastest first, each with
its own capacity (blocks per instance) and eviction policy.

The semantics are upstream's optimizer (``tier_flows`` of tair-kvcache's
``optimizer/docs/strategy_config.md``, its ``RadixTreeIndex`` and ``OptEvictionManager``)
and UPSTREAM_V2 §2.11, so that KVCM's live tiers can be checked against this simulation:

* **Strategy** ``write_through``: a write stores its blocks in every tier; each tier evicts
  on its own and a victim leaves that tier only. ``demote`` (upstream's ``cascading``): a
  write stores in tier 0 only; a victim of tier ``i`` moves to tier ``i + 1`` (where it is
  inserted as a fresh write; nothing moves when that tier holds it already), a victim of
  the last tier is dropped. Victims move in eviction order, coldest first.
* **Leaving the tree.** A block is cached while some tier holds it: the prefix rule of the
  single-tier replay applies to the union of the tiers (a block hits only when every earlier
  block of its request hits in some tier), and a block leaves only when no tier holds it.
* **Reads.** A hit is credited to the fastest tier holding the block. It refreshes every
  tier holding a copy (upstream's ``access_propagation_enabled``, its default) when the
  read refreshes at all, and with ``promote`` (upstream always promotes) it is copied into
  every faster tier; a copy goes through that tier's capacity, so it may evict (and demote).
* Capacities are enforced after every stored block, as the ``instance_precise`` mode does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from chalicelib.optimizer.cost import CostModel
from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.kvcm_policy import KVCMPolicy
from chalicelib.optimizer.planner import GIB, CapacityPlan, StorageTier, storage_tier
from chalicelib.optimizer.policies import make_policy, policy_name
from chalicelib.optimizer.policy_base import EvictionPolicy
from chalicelib.optimizer.replay import ReplayConfig, Replayer, ReplayResult
from chalicelib.optimizer.traces import Record

#: AWS prices a month as 730 hours.
HOURS_PER_MONTH = 730
#: Tier names that are not storage-tier names of the planner but mean one.
TIER_ALIASES = {"mem": "dram", "memory": "dram"}
_BYTE_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": GIB, "tib": 1 << 40, "kb": 10**3, "mb": 10**6}
_BYTE_UNITS.update({"gb": 10**9, "tb": 10**12})
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-z]+)\s*$", re.IGNORECASE)


class Strategy(str, Enum):
    """How blocks reach the slower tiers (module docstring)."""

    WRITE_THROUGH = "write_through"
    DEMOTE = "demote"

    @classmethod
    def parse(cls, value: str | Strategy) -> Strategy:
        """A strategy or its name (``write-through``; upstream's ``cascading`` is ``demote``)."""
        if isinstance(value, cls):
            return value
        name = str(value).strip().lower().replace("-", "_")
        try:
            return cls("demote" if name == "cascading" else name)
        except ValueError:
            raise ConfigError(f"strategy: unknown {value!r}; choose from {', '.join(s.value for s in cls)}") from None


@dataclass(frozen=True)
class TierSpec:
    """One tier: a name (a storage tier of the planner, which prices it), a capacity in
    blocks per instance and an eviction policy."""

    name: str
    capacity: int
    policy: str = "lru"
    policy_params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ConfigError("tier name must not be empty")
        if self.capacity < 0:
            raise ConfigError(f"tier {self.name}: capacity must be >= 0 blocks, got {self.capacity}")
        object.__setattr__(self, "policy", policy_name(self.policy))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "capacity": self.capacity,
            "policy": self.policy,
            "policy_params": dict(self.policy_params),
        }


@dataclass(frozen=True)
class TieredConfig:
    """A tiered replay: the tiers (fastest first), the strategy and the read settings."""

    tiers: tuple[TierSpec, ...]
    strategy: Strategy = Strategy.DEMOTE
    promote: bool = True
    block_size: int = 16
    window_s: float = 60.0
    seed: int = 0
    read_refresh: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "tiers", tuple(self.tiers))
        object.__setattr__(self, "strategy", Strategy.parse(self.strategy))
        if not self.tiers:
            raise ConfigError("tiers: give at least one tier")
        names = [tier.name for tier in self.tiers]
        if len(set(names)) != len(names):
            raise ConfigError(f"tiers: names must be unique, got {', '.join(names)}")
        self.replay_config()  # block_size, window_s: the replay's own checks

    def replay_config(self) -> ReplayConfig:
        """The single-tier replay settings the tiered cache runs under (instance_precise)."""
        first = self.tiers[0]
        return ReplayConfig(
            capacity=first.capacity,
            policy=first.policy,
            block_size=self.block_size,
            window_s=self.window_s,
            seed=self.seed,
            read_refresh=self.read_refresh,
            policy_params=first.policy_params,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "tiers": [tier.to_dict() for tier in self.tiers],
            "strategy": self.strategy.value,
            "promote": self.promote,
            "block_size": self.block_size,
            "window_s": self.window_s,
            "seed": self.seed,
            "read_refresh": self.read_refresh,
        }


def tier_seed(seed: int, tier: int) -> int:
    """The seed of tier ``tier``'s policy: tier 0 draws what a single-tier replay draws."""
    return seed + 1_000_003 * tier


class TieredCache(EvictionPolicy):
    """The tiers of one instance behind the policy interface the replay drives.

    A block is cached while some tier holds it (membership is the union of the tiers).
    Per tier it counts blocks hit (credited to the fastest holder), stored (written,
    demoted or promoted into it), demoted and promoted into it."""

    name = "tiered"
    observes_hits = True

    def __init__(self, tiers: Sequence[EvictionPolicy], capacities: Sequence[int], strategy: Strategy, promote: bool):
        if len(tiers) != len(capacities) or not tiers:
            raise ConfigError("a tiered cache needs one capacity per tier, and a tier")
        self._tiers = list(tiers)
        self._capacities = list(capacities)
        self._demote = strategy is Strategy.DEMOTE
        self._write_tiers = range(1 if self._demote else len(self._tiers))
        # a write refreshes the copies the tiers it does not write hold (upstream's access
        # propagation: a request's read refreshes every copy, and the replay folds that
        # read's refresh into the write)
        self._refreshed_on_write = range(len(self._write_tiers), len(self._tiers))
        self._promote = promote
        # the parent of every cached block, kept when a tier's policy keeps the radix tree
        self._parents: dict[int, int | None] = {}
        self._track_parents = any(policy.uses_parents for policy in self._tiers)
        self._members = [policy.membership() for policy in self._tiers]
        self._sinks: list[list[int]] = []
        for policy in self._tiers:
            sink: list[int] = []
            policy.record_victims(sink)
            self._sinks.append(sink)
        # kvcm tiers judge a drop by every tier's children (a record's), and a demoting
        # tier's rounds hand their victims on whatever children the slower tiers hold
        shared_children: dict[int, int] = {}
        for index, policy in enumerate(self._tiers):
            if isinstance(policy, KVCMPolicy):
                policy.share_children(shared_children)
                policy.hands_on = self._demote and index < len(self._tiers) - 1
        self._timed = [i for i, policy in enumerate(self._tiers) if policy.timed]
        self.timed = bool(self._timed)
        self.refresh_on_write = all(policy.refresh_on_write for policy in self._tiers)
        n = len(self._tiers)
        self.hit_blocks = [0] * n
        self.stored_blocks = [0] * n
        self.demoted_blocks = [0] * n
        self.promoted_blocks = [0] * n

    def tier(self, index: int) -> EvictionPolicy:
        """The policy (cache state) of tier ``index``."""
        return self._tiers[index]

    def fastest_holder(self, key: int) -> int | None:
        """The index of the fastest tier holding ``key`` (None when no tier does)."""
        for index, policy in enumerate(self._tiers):
            if key in policy:
                return index
        return None

    # ------------------------------------------------------------ membership: the union

    def __len__(self) -> int:
        # the slowest tier's blocks, plus each faster tier's blocks no slower tier holds:
        # no union of the large slow tiers is built
        tiers, members = self._tiers, self._members
        count = len(tiers[-1])
        for index in range(len(tiers) - 1):
            slower = members[index + 1 :]
            count += sum(1 for key in tiers[index].keys() if not any(key in m for m in slower))
        return count

    def __contains__(self, key: object) -> bool:
        for members in self._members:
            if key in members:
                return True
        return False

    def _holder(self, key: int) -> int:
        """The fastest tier holding a cached ``key``."""
        index = 0
        for members in self._members:
            if key in members:
                return index
            index += 1
        raise KeyError(key)

    def keys(self) -> set[int]:
        return set().union(*(policy.keys() for policy in self._tiers))

    def match_prefix(self, keys: Sequence[int]) -> int:
        all_members = self._members
        hits = 0
        for key in keys:
            for members in all_members:
                if key in members:
                    break
            else:
                return hits
            hits += 1
        return hits

    # ------------------------------------------------------------ the replay's interface

    def hit(self, keys: Sequence[int], refresh: bool) -> None:
        tiers = self._tiers
        # every key of a hit is cached: its holder is a tier index
        holders = [self._holder(key) for key in keys]
        credit = self.hit_blocks
        for holder in holders:
            credit[holder] += 1
        if refresh:
            self.touch(keys)
        if self._promote:
            for index in range(len(tiers) - 1):
                # children first, so a promoted parent is never less recent than its child
                up = [key for key, holder in zip(reversed(keys), reversed(holders), strict=True) if holder > index]
                if up:
                    self.promoted_blocks[index] += self._store_each(index, up)

    def touch(self, keys: Sequence[int]) -> None:
        """Refresh every tier's copies of ``keys``."""
        for policy in self._tiers:
            policy.touch(keys)

    def insert(self, keys: Sequence[int], limit: int | None = None, parent: int | None = None) -> int:
        """A write, into the strategy's write tiers; ``limit`` is ignored (every tier keeps
        its own capacity)."""
        # membership tests per key only: a set operation on a tier's keys would walk the tier
        all_members = self._members
        fresh = {key for key in keys if not any(key in members for members in all_members)}
        if self._track_parents:
            parents = self._parents
            for position, key in enumerate(keys):
                key_parent = keys[position - 1] if position else parent
                parents.setdefault(key, None if key_parent == key else key_parent)
        taken: set[int] = set()
        for index in self._write_tiers:
            capacity = self._capacities[index]
            if not capacity:
                continue  # a tier without room takes nothing
            members, sink = self._members[index], self._sinks[index]
            new = {key for key in keys if key not in members}
            self._tiers[index].insert(keys, capacity, parent)
            # taken: held now, or evicted by this very write (a policy may refuse some)
            evicted = set(sink)
            took = {key for key in new if key in members or key in evicted}
            self.stored_blocks[index] += len(took)
            taken |= took
            self._settle(index)
        for index in self._refreshed_on_write:
            self._tiers[index].touch(keys)
        return len(fresh & taken)

    def evict(self, count: int) -> int:
        """Evict ``count`` blocks of tier 0 by its policy; the victims follow the strategy."""
        evicted = self._tiers[0].evict(count)
        self._settle(0)
        return evicted

    def advance(self, timestamp_us: int) -> None:
        for index in self._timed:
            self._tiers[index].advance(timestamp_us)
            self._settle(index)

    # ------------------------------------------------------------ moving blocks

    def _store_each(self, index: int, keys: Sequence[int]) -> int:
        """Copy cached blocks into tier ``index`` in the order given, each under its own
        parent (a demotion, coldest first, or a promotion, children first); returns how
        many the tier did not hold (one it holds is refreshed, as a write refreshes).

        Consecutive keys that are child then parent (what LRU evicts together) go in one
        insert of their chain, which stores its last key first: the same order."""
        policy, parents = self._tiers[index], self._parents
        capacity = self._capacities[index]
        if not capacity:
            return 0  # a tier without room takes nothing
        runs: list[list[int]] = []
        if not self._track_parents:
            runs = [list(keys)] if keys else []  # no tier reads the parent links: one insert
        else:
            for key in keys:
                if runs and parents.get(runs[-1][-1]) == key:
                    runs[-1].append(key)
                else:
                    runs.append([key])
        stored = 0
        for run in runs:
            run.reverse()
            stored += policy.insert(run, capacity, parents.get(run[0]))
        self.stored_blocks[index] += stored
        if runs:
            self._settle(index)
        return stored

    def _settle(self, index: int) -> None:
        """Move the victims tier ``index`` recorded: demote them, or let them go (a block
        no tier holds leaves the tree)."""
        sink = self._sinks[index]
        if not sink:
            return
        members = self._members[index]
        distinct = sink if len(sink) == 1 else dict.fromkeys(sink)
        victims = [key for key in distinct if key not in members]  # in eviction order
        sink.clear()
        below = index + 1
        if self._demote and below < len(self._tiers):
            self.demoted_blocks[below] += self._store_each(below, victims)
        if self._track_parents:
            parents, contains = self._parents, self.__contains__
            for key in victims:
                if not contains(key):
                    parents.pop(key, None)


@dataclass(frozen=True)
class TierStats:
    """One tier over the whole replay (all instances)."""

    spec: TierSpec
    hit_blocks: int
    hit_ratio: float | None  # hit blocks credited to this tier / blocks read
    stored_blocks: int
    demoted_blocks: int
    promoted_blocks: int
    cached_blocks: int  # held at the end

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.spec.to_dict(),
            "hit_blocks": self.hit_blocks,
            "hit_ratio": self.hit_ratio,
            "stored_blocks": self.stored_blocks,
            "demoted_blocks": self.demoted_blocks,
            "promoted_blocks": self.promoted_blocks,
            "cached_blocks": self.cached_blocks,
        }


@dataclass
class TieredResult:
    """The replay's totals (over the union of the tiers) and each tier's share."""

    config: TieredConfig
    replay: ReplayResult
    tiers: list[TierStats]

    @property
    def hit_ratio(self) -> float | None:
        """Blocks served by some tier / blocks read."""
        return self.replay.totals.external_block_hit_ratio

    def tier_hit_tokens(self) -> list[float]:
        """The replay's external hit tokens split over the tiers by their hit blocks."""
        total = sum(t.hit_blocks for t in self.tiers)
        tokens = self.replay.totals.external_hit_tokens
        return [tokens * t.hit_blocks / total if total else 0.0 for t in self.tiers]

    def to_dict(self) -> dict[str, Any]:
        data = self.replay.to_dict()
        data["config"] = self.config.to_dict()
        data["tiers"] = [t.to_dict() for t in self.tiers]
        return data


def tiered_replay(records: Iterable[Record], config: TieredConfig) -> TieredResult:
    """Replay ``records`` through ``config``'s tiers, one set of tiers per instance."""
    caches: list[TieredCache] = []

    def build(seed: int) -> EvictionPolicy:
        tiers = [
            make_policy(spec.policy, seed=tier_seed(seed, index), **spec.policy_params)
            for index, spec in enumerate(config.tiers)
        ]
        cache = TieredCache(tiers, [spec.capacity for spec in config.tiers], config.strategy, config.promote)
        caches.append(cache)
        return cache

    result = Replayer(config.replay_config(), build).run(records)
    read_blocks = result.totals.read_blocks
    stats = []
    for index, spec in enumerate(config.tiers):
        hits = sum(cache.hit_blocks[index] for cache in caches)
        stats.append(
            TierStats(
                spec=spec,
                hit_blocks=hits,
                hit_ratio=hits / read_blocks if read_blocks else None,
                stored_blocks=sum(cache.stored_blocks[index] for cache in caches),
                demoted_blocks=sum(cache.demoted_blocks[index] for cache in caches),
                promoted_blocks=sum(cache.promoted_blocks[index] for cache in caches),
                cached_blocks=sum(len(cache.tier(index)) for cache in caches),
            )
        )
    return TieredResult(config, result, stats)


# ------------------------------------------------------------ sizes and money


def parse_size(text: str) -> int | None:
    """``8GiB`` -> bytes (binary KiB..TiB, decimal KB..TB, B); None when ``text`` has no
    byte unit (then it is a block count)."""
    match = _SIZE.match(text)
    if match is None or match.group(2).lower() not in _BYTE_UNITS:
        return None
    return int(float(match.group(1)) * _BYTE_UNITS[match.group(2).lower()])


def tier_storage(name: str, prices: Mapping[str, float] | None = None) -> StorageTier:
    """The planner's storage tier a tier name means (``mem`` is ``dram``), with its price."""
    canonical = name.strip().lower()
    try:
        return storage_tier(TIER_ALIASES.get(canonical, canonical), prices)
    except ConfigError as exc:
        raise ConfigError(f"tier {name}: {exc}") from None


def tier_costs(
    result: TieredResult,
    plan: CapacityPlan,
    cost: CostModel,
    prices: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Per tier: its GiB (capacity x instances), storage cost per hour and month, and the
    GPU time its hits save; plus the totals and the net (saved - storage) per hour.

    A tier is priced on its capacity (no watermark headroom); request charges (S3 GET/PUT)
    are not priced -- ``stored_blocks`` and ``hit_blocks`` count them."""
    instances = max(1, len(result.replay.instances))
    duration = result.replay.duration_s
    rows = []
    for stats, tokens in zip(result.tiers, result.tier_hit_tokens(), strict=True):
        storage = tier_storage(stats.spec.name, prices)
        gib = plan.gib(stats.spec.capacity) * instances
        per_hour = gib * storage.gib_hour_price
        saved = cost.savings(tokens, duration)["cost_per_hour"]
        rows.append(
            {
                **stats.to_dict(),
                "storage_tier": storage.name,
                "storage_type": storage.storage_type,
                "gib_hour_price": storage.gib_hour_price,
                "capacity_gib": gib,
                "storage_cost_per_hour": per_hour,
                "storage_cost_per_month": per_hour * HOURS_PER_MONTH,
                "gpu_cost_saved_per_hour": saved,
            }
        )
    storage_total = sum(row["storage_cost_per_hour"] for row in rows)
    saved_values = [row["gpu_cost_saved_per_hour"] for row in rows]
    saved_total = None if None in saved_values else sum(saved_values)
    return {
        "tiers": rows,
        "hit_ratio": result.hit_ratio,
        "storage_cost_per_hour": storage_total,
        "storage_cost_per_month": storage_total * HOURS_PER_MONTH,
        "gpu_cost_saved_per_hour": saved_total,
        "net_per_hour": None if saved_total is None else saved_total - storage_total,
        "currency": plan.currency,
    }


def equal_cost_capacity(
    tiers: Sequence[TierSpec], plan: CapacityPlan, target: str, prices: Mapping[str, float] | None = None
) -> int:
    """Blocks per instance that ``target`` alone holds for what ``tiers`` cost together."""
    storage = tier_storage(target, prices)
    if storage.gib_hour_price <= 0:
        raise ConfigError(f"tier {target}: a free tier has no equal-cost capacity")
    budget = sum(plan.gib(t.capacity) * tier_storage(t.name, prices).gib_hour_price for t in tiers)
    return math.floor(budget / storage.gib_hour_price * GIB / plan.block_bytes + 1e-9)  # no float shortfall
