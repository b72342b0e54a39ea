"""Per-instance tuning: split a group's quota among its instances to maximise the group's
hit ratio, from each instance's own hit-ratio curve.

Curves are exact prefix-aware LRU curves (one pass per instance over its records, e.g.
KVCM's event log), read at the capacity KVCM really keeps under a quota: ``quota x
used_percentage`` (its watermark). Curves are not concave -- a working set fits or it does
not, so hits jump at a cliff -- and greedy marginal allocation stops short of a cliff. The
split is therefore a knapsack: dynamic programming over quota granules (``granules`` per
group quota), exact on that grid whatever the curves' shape.

A recommendation moves at most ``max_shift`` of the group quota per run (changes are
applied a step at a time and measured in between) and says what it expects to gain.

Quotas are in blocks, or in bytes when ``block_bytes`` gives each instance's block size in
bytes (KVCM's ``instance_quotas``: instances of a group may have different specs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.mrc import HitRatioCurve, lru_curve
from chalicelib.optimizer.traces import Record


def instance_curves(records: Iterable[Record], block_size: int) -> dict[str, HitRatioCurve]:
    """The exact LRU curve of every instance in ``records``."""
    by_instance: dict[str, list[Record]] = {}
    for record in records:
        by_instance.setdefault(record.instance, []).append(record)
    return {name: lru_curve(recs, block_size=block_size) for name, recs in by_instance.items()}


@dataclass(frozen=True)
class QuotaSplit:
    """Per-instance quotas (blocks) and the hits they are expected to give."""

    quotas: dict[str, int]
    hits: float  # external hit blocks of the group over the curves' records
    read_blocks: int
    internal_hit_blocks: int

    @property
    def hit_ratio(self) -> float | None:
        if not self.read_blocks:
            return None
        return (self.internal_hit_blocks + self.hits) / self.read_blocks


BlockBytes = Mapping[str, int] | None


def _blocks(quota: int, used_fraction: float, name: str, block_bytes: BlockBytes) -> int:
    """Blocks an instance keeps under ``quota`` (blocks, or bytes with ``block_bytes``)."""
    per_block = block_bytes[name] if block_bytes is not None else 1
    return int(quota * used_fraction / per_block)


def _hits(
    curve: HitRatioCurve, quota: int, used_fraction: float, name: str = "", block_bytes: BlockBytes = None
) -> float:
    return curve.external_hits(_blocks(quota, used_fraction, name, block_bytes))


def evaluate(
    curves: Mapping[str, HitRatioCurve],
    quotas: Mapping[str, int],
    used_fraction: float = 0.9,
    block_bytes: BlockBytes = None,
) -> QuotaSplit:
    """What ``quotas`` give, per the curves."""
    missing = sorted(set(curves) - set(quotas))
    if missing:
        raise ConfigError(f"no quota for instance(s) {', '.join(missing)}")
    unsized = sorted(set(curves) - set(block_bytes)) if block_bytes is not None else []
    if unsized or (block_bytes is not None and any(block_bytes[n] <= 0 for n in curves)):
        raise ConfigError(f"no positive block size for instance(s) {', '.join(unsized or sorted(curves))}")
    return QuotaSplit(
        {name: quotas[name] for name in curves},
        sum(_hits(c, quotas[name], used_fraction, name, block_bytes) for name, c in curves.items()),
        sum(c.read_blocks for c in curves.values()),
        sum(c.internal_hit_blocks for c in curves.values()),
    )


def best_split(
    curves: Mapping[str, HitRatioCurve],
    total: int,
    used_fraction: float = 0.9,
    granules: int = 200,
    block_bytes: BlockBytes = None,
    floor: int = 0,
) -> QuotaSplit:
    """The split of ``total`` blocks (bytes with ``block_bytes``) among the instances with
    the most hits, every instance keeping at least ``floor``; exact on a grid of what the
    floors leave / ``granules`` (dynamic programming: cliffs are found)."""
    if total < 0 or granules < 1 or floor < 0:
        raise ConfigError("total and floor must be >= 0 and granules >= 1")
    names = sorted(curves)
    if not names:
        return QuotaSplit({}, 0.0, 0, 0)
    rest = total - floor * len(names)
    if rest < 0:
        raise ConfigError(f"{len(names)} floors of {floor} exceed the total {total}")
    unit = max(1, math.ceil(rest / granules))
    slots = rest // unit
    # best[g] = most hits of the instances so far with g granules; choice[i][g] = granules
    # given to instance i in that optimum
    best = [0.0] * (slots + 1)
    choices: list[list[int]] = []
    for name in names:
        gains = [_hits(curves[name], floor + g * unit, used_fraction, name, block_bytes) for g in range(slots + 1)]
        merged = [0.0] * (slots + 1)
        choice = [0] * (slots + 1)
        for g in range(slots + 1):
            top, pick = -1.0, 0
            for mine in range(g + 1):
                value = best[g - mine] + gains[mine]
                if value > top:
                    top, pick = value, mine
            merged[g], choice[g] = top, pick
        best = merged
        choices.append(choice)
    quotas: dict[str, int] = {}
    g = slots
    for name, choice in zip(reversed(names), reversed(choices), strict=True):
        quotas[name] = floor + choice[g] * unit
        g -= choice[g]
    # what the grid leaves over goes to the instance that gains most from it
    spare = total - sum(quotas.values())
    if spare:

        def gain(name: str) -> float:
            return _hits(curves[name], quotas[name] + spare, used_fraction, name, block_bytes) - _hits(
                curves[name], quotas[name], used_fraction, name, block_bytes
            )

        quotas[max(names, key=gain)] += spare
    return evaluate(curves, quotas, used_fraction, block_bytes)


def recommend(
    curves: Mapping[str, HitRatioCurve],
    current: Mapping[str, int],
    used_fraction: float = 0.9,
    max_shift: float = 0.2,
    granules: int = 200,
    block_bytes: BlockBytes = None,
    floor: int = 0,
) -> dict[str, Any]:
    """A bounded step from ``current`` quotas toward the best split of their total (no
    instance under ``floor``): every instance moves the same share of its way there, at
    most ``max_shift`` of the total quota changing hands (the next run continues from what
    this one measured)."""
    if not 0 < max_shift <= 1:
        raise ConfigError(f"max_shift must be in (0, 1], got {max_shift}")
    total = sum(current.values())
    now = evaluate(curves, current, used_fraction, block_bytes)
    target = best_split(curves, total, used_fraction, granules, block_bytes, floor)
    if target.hits <= now.hits:
        target = now  # the grid found nothing better: no change
    deltas = {n: target.quotas[n] - current[n] for n in curves}
    wanted = sum(d for d in deltas.values() if d > 0)
    share = min(1.0, max_shift * total / wanted) if wanted else 0.0
    # every instance moves the same share of the way (rounded toward where it is now);
    # what rounding leaves goes to the instance with the largest move wanted
    moved = {n: int(d * share) for n, d in deltas.items()}
    if wanted:
        moved[max(curves, key=lambda n: deltas[n])] -= sum(moved.values())
    proposed = {n: current[n] + moved[n] for n in curves}
    step = evaluate(curves, proposed, used_fraction, block_bytes)
    return {
        "total_quota_blocks": total,
        "used_percentage": used_fraction,
        "current": {"quotas": now.quotas, "group_hit_ratio": now.hit_ratio},
        "recommended": {
            "quotas": step.quotas,
            "group_hit_ratio": step.hit_ratio,
            "expected_gain": (step.hit_ratio or 0.0) - (now.hit_ratio or 0.0),
        },
        "optimum": {"quotas": target.quotas, "group_hit_ratio": target.hit_ratio},
        "changes": {n: moved[n] for n in curves if moved[n]},
        "per_instance": {
            n: {
                "current": current[n],
                "recommended": proposed[n],
                "hit_ratio_now": curves[n].block_hit_ratio(_blocks(current[n], used_fraction, n, block_bytes)),
                "hit_ratio_recommended": curves[n].block_hit_ratio(_blocks(proposed[n], used_fraction, n, block_bytes)),
            }
            for n in curves
        },
    }
