"""Watermarks: whether a group needs reclaiming, and how much one round frees (pure).

Three kinds of limit, each with its own trigger (API.md, "Capacity"):

- the group total in bytes: ``quota.capacity`` × ``used_percentage``, or
  ``trigger_strategy.used_size`` when set (whichever is lower: either one triggers);
- each storage type in bytes: its ``quota_config`` capacity × ``used_percentage``;
- each instance's block count: ``max_key_count`` × ``used_percentage``;
- each instance's own bytes (``instance_quotas``, KVCM extension): its quota ×
  ``used_percentage``. An instance over its own trigger also gives first when the group
  total is over: the group's excess is taken from the instances over their shares, in
  proportion to how far over they are, before the rest is spread by usage.

A round frees what is over the trigger, bounded by one step: ``reclaim_step_percentage``
of the limit and, for bytes, ``reclaim_step_size``. After a refused write ("pressure")
the trigger is also kept at least one step — at most ``PRESSURE_HEADROOM_PERCENT`` of
the limit — under the hard limit, so that a group configured with ``used_percentage``
1.0 does not refuse writes forever; with the defaults (0.9, 10 %) it changes nothing.
A ``used_percentage`` above 1 switches that off too: it never triggers (upstream's reclaim
cases use 3.2 so that a full group refuses writes rather than reclaim).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..index import Usage
from ..protocol.models import DEFAULT_RECLAIM_STEP_PERCENTAGE, DEFAULT_USED_PERCENTAGE, InstanceGroup

#: Under pressure, the free room kept under a hard limit is one step, at most this % of it.
PRESSURE_HEADROOM_PERCENT = 10


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Limits:
    """The capacity settings of one group, defaults applied (0 = no such limit)."""

    capacity: int = 0
    type_capacity: Mapping[str, int] = field(default_factory=dict)
    max_keys: int = 0
    used_fraction: float = DEFAULT_USED_PERCENTAGE
    used_size: int = 0
    step_size: int = 0
    step_percentage: int = DEFAULT_RECLAIM_STEP_PERCENTAGE
    #: Bytes per instance id (``instance_quotas``: each > 0).
    instance_capacity: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, group: InstanceGroup) -> Limits:
        """The limits a stored group (see control/groups.py for the defaults) declares."""
        quota = group.quota
        cache = group.cache_config
        strategy = cache.reclaim_strategy if cache is not None else None
        trigger = strategy.trigger_strategy if strategy is not None else None
        indexer = cache.meta_indexer_config if cache is not None else None
        return cls(
            capacity=quota.capacity if quota is not None else 0,
            type_capacity={
                q.storage_type.name: q.capacity for q in (quota.quota_config if quota else ()) if q.capacity > 0
            },
            max_keys=indexer.max_key_count if indexer is not None else 0,
            used_fraction=(
                trigger.used_percentage
                if trigger is not None and trigger.used_percentage > 0
                else DEFAULT_USED_PERCENTAGE
            ),
            used_size=trigger.used_size if trigger is not None else 0,
            step_size=strategy.reclaim_step_size if strategy is not None else 0,
            step_percentage=(
                strategy.reclaim_step_percentage
                if strategy is not None and strategy.reclaim_step_percentage > 0
                else DEFAULT_RECLAIM_STEP_PERCENTAGE
            ),
            instance_capacity=dict(group.instance_quotas),
        )

    def step(self, reference: int, in_bytes: bool) -> int:
        """One round's bound for a limit of ``reference`` (bytes, or blocks)."""
        step = max(1, math.ceil(reference * self.step_percentage / 100))
        if in_bytes and self.step_size > 0:
            step = min(step, self.step_size)
        return step

    def trigger(self, limit: int) -> int:
        """Where reclaim starts for a hard limit of ``limit``."""
        # rounded first: 100 × 0.29 is 28.999999999999996 in binary floating point
        return math.floor(round(limit * self.used_fraction, 6))


def _excess(used: int, trigger: int | None, limit: int, step: int, pressure: bool) -> int:
    """What to free now: the amount over ``trigger``, at most one ``step``."""
    if pressure and limit > 0:
        ceiling = limit - min(step, math.ceil(limit * PRESSURE_HEADROOM_PERCENT / 100))
        trigger = ceiling if trigger is None else min(trigger, ceiling)
    if trigger is None:
        return 0
    return min(max(0, used - trigger), step)


@dataclass(frozen=True)
class Plan:
    """What one round frees in a group: bytes of the total, bytes per storage type,
    blocks per instance and bytes per instance over its own quota's trigger."""

    bytes: int = 0
    by_type: Mapping[str, int] = field(default_factory=dict)
    keys: Mapping[str, int] = field(default_factory=dict)
    instance_bytes: Mapping[str, int] = field(default_factory=dict)
    #: How far each instance is over its own quota's trigger (bytes), whatever the step.
    over_share: Mapping[str, int] = field(default_factory=dict)

    @property
    def needed(self) -> bool:
        return (
            self.bytes > 0 or any(self.by_type.values()) or any(self.keys.values()) or any(self.instance_bytes.values())
        )


def assess(limits: Limits, usages: Mapping[str, Usage], pressure: bool = False) -> Plan:
    """The round's plan for a group whose instances use ``usages`` (by instance id)."""
    pressure = pressure and limits.used_fraction <= 1
    total = sum(u.bytes for u in usages.values())
    triggers = []
    if limits.capacity > 0:
        triggers.append(limits.trigger(limits.capacity))
    if limits.used_size > 0:
        triggers.append(limits.used_size)
    reference = limits.capacity or limits.used_size
    free_bytes = 0
    if reference > 0:
        free_bytes = _excess(total, min(triggers), limits.capacity, limits.step(reference, True), pressure)
    by_type = {}
    for storage_type, capacity in limits.type_capacity.items():
        used = sum(u.by_type.get(storage_type, 0) for u in usages.values())
        amount = _excess(used, limits.trigger(capacity), capacity, limits.step(capacity, True), pressure)
        if amount > 0:
            by_type[storage_type] = amount
    keys = {}
    if limits.max_keys > 0:
        step = limits.step(limits.max_keys, False)
        for instance_id, usage in usages.items():
            amount = _excess(usage.keys, limits.trigger(limits.max_keys), limits.max_keys, step, pressure)
            if amount > 0:
                keys[instance_id] = amount
    instance_bytes, over_share = {}, {}
    for instance_id, capacity in limits.instance_capacity.items():
        own = usages.get(instance_id)
        if own is None:
            continue
        trigger = limits.trigger(capacity)
        over_share[instance_id] = max(0, own.bytes - trigger)
        amount = _excess(own.bytes, trigger, capacity, limits.step(capacity, True), pressure)
        if amount > 0:
            instance_bytes[instance_id] = amount
    return Plan(free_bytes, by_type, keys, instance_bytes, {i: o for i, o in over_share.items() if o > 0})


@dataclass
class Need:
    """What one instance still has to free this round. Mutable: victims are taken off it."""

    bytes: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    keys: int = 0

    @property
    def pending(self) -> bool:
        return self.bytes > 0 or self.keys > 0 or any(v > 0 for v in self.by_type.values())

    def wants(self, storage_type: str) -> bool:
        """Whether freeing a block stored on ``storage_type`` helps."""
        return self.bytes > 0 or self.keys > 0 or self.by_type.get(storage_type, 0) > 0

    def take(self, size: int, storage_type: str) -> None:
        """Account for one freed block of ``size`` bytes."""
        self.bytes = max(0, self.bytes - size)
        self.keys = max(0, self.keys - 1)
        if storage_type in self.by_type:
            self.by_type[storage_type] = max(0, self.by_type[storage_type] - size)

    def blocks(self, block_bytes: int) -> int:
        """About how many blocks of ``block_bytes`` meet this need."""
        largest = max([self.bytes, *self.by_type.values()])
        return max(self.keys, _ceil_div(largest, block_bytes) if block_bytes > 0 else 0)

    def copy(self) -> Need:
        return Need(self.bytes, dict(self.by_type), self.keys)


def _share(amount: int, part: int, whole: int) -> int:
    """``amount`` × part / whole, rounded up, at most ``part``."""
    return min(part, _ceil_div(amount * part, whole)) if whole > 0 and amount > 0 else 0


def _even(amount: int, part: int, holders: int) -> int:
    """An equal share of ``amount`` among ``holders``, rounded up, at most ``part``."""
    return min(part, _ceil_div(amount, holders)) if holders > 0 and amount > 0 and part > 0 else 0


def split(plan: Plan, usages: Mapping[str, Usage], even: bool = False) -> dict[str, Need]:
    """The plan spread over the instances: the group's bytes first from the instances
    over their own share (in proportion to how far over), the rest in proportion to
    usage (``even``: in equal shares among the instances holding any, the
    FIXED_PER_INSTANCE budget), as bytes of each type are; block counts and own-quota
    bytes are per instance already (an instance frees the larger of its share and its
    own excess)."""
    total = sum(u.bytes for u in usages.values())
    type_totals = {t: sum(u.by_type.get(t, 0) for u in usages.values()) for t in plan.by_type}
    holders = sum(1 for u in usages.values() if u.bytes > 0)
    type_holders = {t: sum(1 for u in usages.values() if u.by_type.get(t, 0) > 0) for t in plan.by_type}
    over_total = sum(plan.over_share.values())
    first = min(plan.bytes, over_total)
    needs = {}
    for instance_id, usage in usages.items():
        if even:
            by_type = {t: _even(n, usage.by_type.get(t, 0), type_holders[t]) for t, n in plan.by_type.items()}
            rest = _even(plan.bytes - first, usage.bytes, holders)
        else:
            by_type = {t: _share(n, usage.by_type.get(t, 0), type_totals[t]) for t, n in plan.by_type.items()}
            rest = _share(plan.bytes - first, usage.bytes, total)
        group_bytes = _share(first, plan.over_share.get(instance_id, 0), over_total) + rest
        need = Need(
            max(group_bytes, plan.instance_bytes.get(instance_id, 0)),
            {t: n for t, n in by_type.items() if n > 0},
            plan.keys.get(instance_id, 0),
        )
        if need.pending:
            needs[instance_id] = need
    return needs


def own_needs(plan: Plan) -> dict[str, Need]:
    """The per-instance part of the plan alone (block counts, own-quota bytes): what
    Group-LRU frees in each instance before the group's part."""
    needs = {}
    for instance_id in set(plan.keys) | set(plan.instance_bytes):
        need = Need(plan.instance_bytes.get(instance_id, 0), {}, plan.keys.get(instance_id, 0))
        if need.pending:
            needs[instance_id] = need
    return needs
