"""Sweeps: replay a trace at every (policy, capacity[, instance]) grid point, in parallel.

Points that prefix-aware LRU answers exactly from one pass (policy ``lru``, mode
``instance_precise``, no per-instance capacities, and reads that need no refresh) are all
taken from one hit-ratio curve instead of one replay each; the rest run as replays in a
``ProcessPoolExecutor`` whose workers load the trace once each.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.mrc import lru_curve
from chalicelib.optimizer.policies import policy_name
from chalicelib.optimizer.replay import EvictionMode, ReplayConfig, Totals, replay
from chalicelib.optimizer.traces import Op, Record, read_trace, resolve_format


@dataclass(frozen=True)
class TraceSpec:
    """Where a trace is and how to read it."""

    path: str
    format: str = "auto"
    instance: str | None = None  # instance name for single-instance formats
    block_size: int | None = None  # tokens per block; None: the format's default

    def resolved(self) -> TraceSpec:
        """The same spec with the format sniffed and the block size filled in."""
        fmt = resolve_format(self.path, self.format)
        return replace(self, format=fmt.name, block_size=self.block_size or fmt.block_size)

    def records(self) -> list[Record]:
        """Load every record (sweeps replay the trace many times)."""
        return list(read_trace(self.path, self.format, instance=self.instance, block_size=self.block_size))


@dataclass(frozen=True)
class TraceSummary:
    """What a report says about the trace itself."""

    records: int
    reads: int
    read_blocks: int
    written_blocks: int
    instances: tuple[str, ...]
    first_timestamp_us: int | None
    last_timestamp_us: int | None

    @property
    def duration_s(self) -> float:
        if self.first_timestamp_us is None or self.last_timestamp_us is None:
            return 0.0
        return (self.last_timestamp_us - self.first_timestamp_us) / 1e6

    @classmethod
    def of(cls, records: Iterable[Record]) -> TraceSummary:
        """One streaming pass over ``records``."""
        count = reads = read_blocks = written = 0
        instances: dict[str, None] = {}
        first = last = None
        for record in records:
            count += 1
            instances[record.instance] = None
            ts = record.timestamp_us
            first = ts if first is None or ts < first else first
            last = ts if last is None or ts > last else last
            if record.op is not Op.WRITE:
                reads += 1
                read_blocks += len(record.keys)
            if record.op is not Op.READ:
                written += len(record.keys)
        return cls(count, reads, read_blocks, written, tuple(instances), first, last)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["instances"] = list(self.instances)
        data["duration_s"] = self.duration_s
        return data


@dataclass(frozen=True)
class SweepSettings:
    """Replay settings shared by every grid point (see :class:`ReplayConfig`)."""

    mode: EvictionMode = EvictionMode.INSTANCE_PRECISE
    batch_size: int = 64
    block_size: int = 16
    window_s: float = 60.0
    seed: int = 0
    read_refresh: bool = True
    policy_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", EvictionMode.parse(self.mode))
        object.__setattr__(self, "policy_params", {policy_name(k): dict(v) for k, v in self.policy_params.items()})

    def replay_config(self, policy: str, capacity: int) -> ReplayConfig:
        """The replay configuration of one grid point."""
        return ReplayConfig(
            capacity=capacity,
            policy=policy,
            mode=self.mode,
            batch_size=self.batch_size,
            block_size=self.block_size,
            window_s=self.window_s,
            seed=self.seed,
            read_refresh=self.read_refresh,
            policy_params=self.policy_params.get(policy_name(policy), {}),
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["mode"] = self.mode.value
        data["policy_params"] = {k: dict(v) for k, v in self.policy_params.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SweepSettings:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown sweep settings: {', '.join(unknown)}")
        return cls(**data)


@dataclass(frozen=True)
class GridPoint:
    """One replay of a sweep; ``instance`` None means all instances together."""

    policy: str
    capacity: int
    instance: str | None = None


@dataclass
class PointResult:
    """The totals of one grid point and how they were obtained."""

    policy: str
    capacity: int
    instance: str | None
    totals: Totals
    method: str  # "replay" or "curve" (exact one-pass LRU)
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "capacity": self.capacity,
            "instance": self.instance,
            "method": self.method,
            "elapsed_s": self.elapsed_s,
            **self.totals.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PointResult:
        counters = {k: data[k] for k in Totals.__dataclass_fields__}
        return cls(
            data["policy"],
            int(data["capacity"]),
            data.get("instance"),
            Totals(**counters),
            data.get("method", "replay"),
            float(data.get("elapsed_s", 0.0)),
        )


def grid(
    capacities: Iterable[int], policies: Iterable[str], instances: Sequence[str | None] = (None,)
) -> list[GridPoint]:
    """Every (policy, capacity, instance) combination, policies first."""
    caps = sorted(set(capacities))
    if not caps or any(c < 0 for c in caps):
        raise ConfigError("a sweep needs at least one capacity, all >= 0")
    names = list(dict.fromkeys(policy_name(p) for p in policies))
    if not names:
        raise ConfigError("a sweep needs at least one policy")
    return [GridPoint(p, c, i) for p in names for c in caps for i in instances]


def curve_is_exact(records: Sequence[Record], settings: SweepSettings) -> bool:
    """True when the one-pass LRU curve equals an LRU replay under ``settings``: the
    instance-precise mode, and reads that either do not refresh or are all followed by a
    write of the same keys (``REQUEST`` records)."""
    if settings.mode is not EvictionMode.INSTANCE_PRECISE:
        return False
    return not settings.read_refresh or all(r.op is not Op.READ for r in records)


def run_point(records: Sequence[Record], point: GridPoint, settings: SweepSettings) -> PointResult:
    """Replay one grid point."""
    if point.instance is not None:
        records = [r for r in records if r.instance == point.instance]
    result = replay(records, settings.replay_config(point.policy, point.capacity))
    return PointResult(point.policy, point.capacity, point.instance, result.totals, "replay", result.elapsed_s)


def curve_points(
    records: Sequence[Record], capacities: Iterable[int], settings: SweepSettings, instance: str | None = None
) -> list[PointResult]:
    """All LRU points of one instance (or of all) from one exact curve; each point is
    charged an equal share of the pass's time."""
    if instance is not None:
        records = [r for r in records if r.instance == instance]
    curve = lru_curve(records, block_size=settings.block_size)
    caps = sorted(set(capacities))
    share = curve.elapsed_s / len(caps)
    return [PointResult("lru", c, instance, curve.totals(c), "curve", share) for c in caps]


# Worker side of the process pool: each worker loads the trace once, in its initializer.
_worker_records: list[Record] = []


def _load_worker(spec: TraceSpec) -> None:
    global _worker_records
    _worker_records = spec.records()


def _worker_point(point: GridPoint, settings: SweepSettings) -> PointResult:
    return run_point(_worker_records, point, settings)


def _worker_curve(capacities: list[int], settings: SweepSettings, instance: str | None) -> list[PointResult]:
    return curve_points(_worker_records, capacities, settings, instance)


@dataclass
class SweepResult:
    """Every grid point of a sweep, with the trace summary."""

    trace: TraceSpec
    summary: TraceSummary
    settings: SweepSettings
    points: list[PointResult]
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace": asdict(self.trace),
            "summary": self.summary.to_dict(),
            "settings": self.settings.to_dict(),
            "points": [p.to_dict() for p in self.points],
            "elapsed_s": self.elapsed_s,
        }


def sweep(
    spec: TraceSpec,
    capacities: Iterable[int],
    policies: Iterable[str],
    *,
    settings: SweepSettings | None = None,
    split_instances: bool = False,
    workers: int | None = None,
    use_curve: bool = True,
) -> SweepResult:
    """Run the grid ``policies x capacities`` (x instances with ``split_instances``).

    ``workers`` processes replay points in parallel (default: one per CPU; 1 runs
    everything in this process). ``split_instances`` replays every instance on its own,
    which the instance modes allow (instances never share capacity there).
    """
    started = time.perf_counter()
    spec = spec.resolved()
    assert spec.block_size is not None, "resolved() fills the block size in"
    settings = replace(settings or SweepSettings(), block_size=spec.block_size)
    if split_instances and settings.mode is EvictionMode.GROUP_ROUGH:
        raise ConfigError("split_instances needs an instance mode: group_rough shares capacity")
    records = spec.records()
    summary = TraceSummary.of(records)
    instances: Sequence[str | None] = summary.instances if split_instances else (None,)
    points = grid(capacities, policies, instances)
    caps = sorted({p.capacity for p in points})
    by_curve = use_curve and curve_is_exact(records, settings)
    replays = [p for p in points if not (by_curve and p.policy == "lru")]
    curves = list(instances) if by_curve and any(p.policy == "lru" for p in points) else []
    workers = workers or os.cpu_count() or 1
    results: list[PointResult] = []
    if workers <= 1 or len(replays) + len(curves) <= 1:
        for instance in curves:
            results.extend(curve_points(records, caps, settings, instance))
        results.extend(run_point(records, p, settings) for p in replays)
    else:
        del records  # the workers load their own copy
        with ProcessPoolExecutor(max_workers=workers, initializer=_load_worker, initargs=(spec,)) as pool:
            curve_jobs = [pool.submit(_worker_curve, caps, settings, i) for i in curves]
            point_jobs = [pool.submit(_worker_point, p, settings) for p in replays]
            for job in curve_jobs:
                results.extend(job.result())
            results.extend(job.result() for job in point_jobs)
    order = {(p.policy, p.capacity, p.instance): n for n, p in enumerate(points)}
    results.sort(key=lambda r: order[(r.policy, r.capacity, r.instance)])
    return SweepResult(spec, summary, settings, results, time.perf_counter() - started)


def refine_capacity(
    records: Sequence[Record],
    settings: SweepSettings,
    policy: str,
    grid: Mapping[int, Totals],
    target: float,
    tolerance: float = 0.02,
) -> list[PointResult]:
    """Replays bisecting between the last grid capacity of ``policy`` under ``target`` and
    the first reaching it, until they are ``tolerance`` (relative) apart; the new points."""
    caps = sorted(grid)
    hi = next((c for c in caps if (grid[c].block_hit_ratio or 0.0) >= target - 1e-12), None)
    if hi is None:
        return []
    lo = max((c for c in caps if c < hi), default=0)
    points = []
    while hi - lo > max(1.0, tolerance * hi):
        mid = (lo + hi) // 2
        started = time.perf_counter()
        totals = replay(records, settings.replay_config(policy, mid)).totals
        points.append(PointResult(policy, mid, None, totals, "replay", time.perf_counter() - started))
        if (totals.block_hit_ratio or 0.0) >= target - 1e-12:
            hi = mid
        else:
            lo = mid
    return points


def aggregate(points: Iterable[PointResult]) -> dict[str, dict[int, Totals]]:
    """Totals per policy and capacity, summed over instances (split sweeps)."""
    table: dict[str, dict[int, Totals]] = {}
    for point in points:
        totals = table.setdefault(point.policy, {}).setdefault(point.capacity, Totals())
        totals.add(point.totals)
    return {policy: dict(sorted(caps.items())) for policy, caps in table.items()}
