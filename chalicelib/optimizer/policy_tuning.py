"""The reclaim parameter a group's policy needs, chosen by replaying its traffic through
the policy KVCM runs (``kvcm``: sampling, watermark, period, step) at its instances' quotas.

* **TTL groups** (``ttl_seconds``): candidates are quantiles of the instances' reuse times
  (seconds from a block's last access to its next read that finds it). The reference is
  the same policy without expiry at the same quotas: the recommendation is the shortest
  candidate whose group hit ratio stays within ``tolerance`` of it. A shorter TTL frees
  blocks nobody reads again sooner; a TTL under the reuse times that matter loses hits.
* **LRU and LFU groups** (``used_percentage``): the reference is ideal LRU filling the
  instances' whole quotas. Every round frees the instance down to the watermark (a step
  at a time, once per period), and between rounds writes fill it toward the limit, where
  the write path evicts on the request path or refuses. The recommendation is the lowest
  candidate watermark whose simulated group hit ratio stays within ``tolerance`` of the
  reference: lower leaves more room for writes between rounds (fewer write-path evictions
  and refused writes, reported per candidate), but under the working set the rounds cut
  hits. If none does, the candidate with the most hits.

A run moves at most a bounded step from the current value toward the choice
(``MAX_TTL_FACTOR``, ``MAX_WATERMARK_STEP``), as quotas move at most ``max_shift``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.kvcm_policy import KVCMPolicy
from chalicelib.optimizer.replay import ReplayConfig, Replayer
from chalicelib.optimizer.traces import Op, Record

#: Group hit ratio a recommended value may lose against the reference (absolute).
HIT_RATIO_TOLERANCE = 0.01
#: A run at most doubles or halves a TTL.
MAX_TTL_FACTOR = 2.0
#: A run moves the watermark by at most this much.
MAX_WATERMARK_STEP = 0.05
#: Watermarks tried (the current one is added); above 0.95 one reclaim step of headroom no
#: longer fits under the limit at the default step.
WATERMARKS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
#: Reuse-time quantiles tried as TTLs (the current TTL is added).
TTL_QUANTILES = (0.5, 0.75, 0.9, 0.95, 0.99, 1.0)


@dataclass(frozen=True)
class ReclaimSettings:
    """A group's live reclaim strategy, as the ``kvcm`` policy takes it."""

    order: str  # lru | lfu | ttl
    used_percentage: float
    step_percentage: int
    period_s: int
    ttl_s: int
    round_s: float  # the reclaimer's schedule: 60 s on AWS, 1 s on the local stack


@dataclass(frozen=True)
class Outcome:
    """What the policy gives over the records with one parameter value."""

    value: float
    hit_ratio: float
    refused_writes: int
    write_path_evictions: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "hit_ratio": self.hit_ratio,
            "refused_writes": self.refused_writes,
            "write_path_evictions": self.write_path_evictions,
        }


def simulate(
    records: Sequence[Record], limits: Mapping[str, int], settings: ReclaimSettings, block_size: int, seed: int = 0
) -> Outcome:
    """Replay ``records`` of the instances in ``limits`` (hard limits, blocks) through the
    ``kvcm`` policy with ``settings``; the group's block hit ratio and write-path figures."""
    if not limits:
        raise ConfigError("simulate needs at least one instance limit")
    config = ReplayConfig(
        capacity=max(limits.values()),
        policy=KVCMPolicy.name,
        instance_capacities=dict(limits),
        block_size=block_size,
        seed=seed,
        policy_params={
            "order": settings.order,
            "ttl_s": settings.ttl_s,
            "used_percentage": settings.used_percentage,
            "step_percentage": settings.step_percentage,
            "period_s": settings.period_s,
            "round_s": settings.round_s,
        },
    )
    replayer = Replayer(config)
    result = replayer.run(r for r in records if r.instance in limits)
    policies = [p for p in map(replayer.policy, replayer.instance_names) if isinstance(p, KVCMPolicy)]
    value = settings.ttl_s if settings.order == "ttl" else settings.used_percentage
    return Outcome(
        value,
        result.totals.block_hit_ratio or 0.0,
        sum(p.refused_writes for p in policies),
        sum(p.evicted["write_path"] for p in policies),
    )


def reuse_times(records: Iterable[Record]) -> list[float]:
    """Seconds from a block's last access (its write, or a read that found it) to each later
    read that finds it, per instance: what a TTL must outlast for the read to hit."""
    last: dict[tuple[str, int], int] = {}
    times: list[float] = []
    for record in records:
        instance, timestamp_us, op, keys = record.instance, record.timestamp_us, record.op, record.keys
        if op is not Op.WRITE:
            for key in keys:
                seen = last.get((instance, key))
                if seen is None:
                    break  # a prefix read stops at its first block never written
                times.append((timestamp_us - seen) / 1e6)
                last[(instance, key)] = timestamp_us
        if op is not Op.READ:
            for key in keys:
                last.setdefault((instance, key), timestamp_us)  # a write does not refresh
    return times


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def recommend_ttl(
    records: Sequence[Record],
    limits: Mapping[str, int],
    settings: ReclaimSettings,
    block_size: int,
    tolerance: float = HIT_RATIO_TOLERANCE,
) -> dict[str, Any] | None:
    """The shortest TTL (from the reuse-time quantiles) whose hit ratio stays within
    ``tolerance`` of the same quotas without expiry; None without any reuse."""
    times = sorted(reuse_times(records))
    if not times:
        return None
    candidates = sorted(
        {max(1, math.ceil(_quantile(times, q))) for q in TTL_QUANTILES}
        | ({settings.ttl_s} if settings.ttl_s > 0 else set())
    )
    reference = simulate(records, limits, replace(settings, ttl_s=0), block_size)
    outcomes = [simulate(records, limits, replace(settings, ttl_s=ttl), block_size) for ttl in candidates]
    good = [o for o in outcomes if o.hit_ratio >= reference.hit_ratio - tolerance]
    optimum = int(good[0].value) if good else int(max(outcomes, key=lambda o: o.hit_ratio).value)
    current = settings.ttl_s
    step = optimum if current <= 0 else round(min(max(optimum, current / MAX_TTL_FACTOR), current * MAX_TTL_FACTOR))
    return {
        "parameter": "ttl_seconds",
        "current": current,
        "optimum": optimum,
        "recommended": int(step),
        "tolerance": tolerance,
        "expected_gain": _gain(
            records, limits, settings, block_size, outcomes, step, reference if current <= 0 else None
        ),
        "reference": {"description": "the same quotas without expiry", **reference.to_dict()},
        "reuse_time_s": {f"p{round(q * 100)}": _quantile(times, q) for q in TTL_QUANTILES},
        "candidates": [o.to_dict() for o in outcomes],
    }


def recommend_watermark(
    records: Sequence[Record],
    limits: Mapping[str, int],
    settings: ReclaimSettings,
    block_size: int,
    reference: float,
    tolerance: float = HIT_RATIO_TOLERANCE,
) -> dict[str, Any]:
    """The lowest watermark at which the live policy stays within ``tolerance`` of
    ``reference``: the group hit ratio of ideal LRU filling the instances' whole limits."""
    current = settings.used_percentage
    candidates = sorted(set(WATERMARKS) | {current})
    outcomes = [simulate(records, limits, replace(settings, used_percentage=u), block_size) for u in candidates]
    good = [o for o in outcomes if o.hit_ratio >= reference - tolerance]
    optimum = good[0].value if good else max(outcomes, key=lambda o: (o.hit_ratio, o.value)).value
    step = round(min(max(optimum, current - MAX_WATERMARK_STEP), current + MAX_WATERMARK_STEP), 4)
    return {
        "parameter": "used_percentage",
        "current": current,
        "optimum": optimum,
        "recommended": step,
        "tolerance": tolerance,
        "expected_gain": _gain(records, limits, settings, block_size, outcomes, step),
        "reference": {"description": "ideal LRU filling the whole quotas", "hit_ratio": reference},
        "candidates": [o.to_dict() for o in outcomes],
    }


def _gain(
    records: Sequence[Record],
    limits: Mapping[str, int],
    settings: ReclaimSettings,
    block_size: int,
    outcomes: list[Outcome],
    step: float,
    now: Outcome | None = None,
) -> float:
    """Simulated group hit ratio at ``step`` minus at the current value (``now``, or the
    candidate equal to it) of the parameter the policy needs (TTL or watermark)."""
    ttl = settings.order == "ttl"

    def at(value: float) -> Outcome:
        known = [o for o in outcomes if o.value == value]
        if known:
            return known[0]
        changed = replace(settings, ttl_s=int(value)) if ttl else replace(settings, used_percentage=value)
        return simulate(records, limits, changed, block_size)

    current = now or at(settings.ttl_s if ttl else settings.used_percentage)
    return at(step).hit_ratio - current.hit_ratio
