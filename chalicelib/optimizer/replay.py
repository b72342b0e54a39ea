"""Replay engine: feed a record stream through per-instance caches and count hits.

Capacities are in blocks. Three eviction modes decide *whose* capacity is enforced and
*when*:

``instance_precise``
    Every instance has its own capacity (``capacity``, or ``instance_capacities[id]``),
    enforced exactly: after every inserted block the instance holds at most its capacity.
``instance_rough``
    Every instance has its own capacity, checked after each write request (so a request's
    blocks may overshoot it for a moment); when over, the instance evicts whole batches of
    ``batch_size`` blocks until it is back under -- like a watermark reclaimer, it may end
    up to ``batch_size - 1`` blocks below.
``group_rough``
    One shared capacity for all instances together, checked after each write request; when
    the group is over, instances give up ``batch_size`` blocks each in round-robin order
    (each by its own policy) until the group is back under.

Reads: a prefix-match read hits the longest cached prefix of its keys; masked keys
(``block_mask``: the engine already holds them) are *internal* hits and are skipped, the
cached keys after them are *external* hits (served by KVCM). With ``read_refresh`` (KVCM's
behaviour) a read refreshes the recency of its external hits. A ``REQUEST`` record is a
read then a write of the same keys: the write touches every key, last block first.

Token accounting: a request's token count is its ``input_tokens`` when the trace gives it,
else blocks x ``block_size``; hit tokens are hit blocks x ``block_size``, capped at that count.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import IO, Any

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.perf import gc_paused
from chalicelib.optimizer.policies import POLICIES, make_policy, policy_name
from chalicelib.optimizer.policy_base import EvictionPolicy
from chalicelib.optimizer.traces import Op, Query, Record


class EvictionMode(str, Enum):
    """Whose capacity is enforced, and when (see the module docstring)."""

    GROUP_ROUGH = "group_rough"
    INSTANCE_ROUGH = "instance_rough"
    INSTANCE_PRECISE = "instance_precise"

    @classmethod
    def parse(cls, value: str | EvictionMode) -> EvictionMode:
        """Accept a mode or its name (``instance-precise`` and ``INSTANCE_PRECISE`` too)."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower().replace("-", "_"))
        except ValueError:
            raise ConfigError(
                f"unknown eviction mode {value!r}; choose from {', '.join(m.value for m in cls)}"
            ) from None


@dataclass(frozen=True)
class ReplayConfig:
    """One replay: a policy at a capacity (blocks) under an eviction mode."""

    capacity: int
    policy: str = "lru"
    mode: EvictionMode = EvictionMode.INSTANCE_PRECISE
    batch_size: int = 64
    instance_capacities: Mapping[str, int] = field(default_factory=dict)
    block_size: int = 16
    window_s: float = 60.0
    seed: int = 0
    read_refresh: bool = True
    policy_params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", policy_name(self.policy))
        object.__setattr__(self, "mode", EvictionMode.parse(self.mode))
        if self.capacity < 0 or any(c < 0 for c in self.instance_capacities.values()):
            raise ConfigError("capacities must be >= 0 blocks")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.block_size < 1:
            raise ConfigError(f"block_size must be >= 1 token, got {self.block_size}")
        if not self.window_s > 0:
            raise ConfigError(f"window_s must be > 0, got {self.window_s}")
        if self.instance_capacities and self.mode is EvictionMode.GROUP_ROUGH:
            raise ConfigError("instance_capacities apply to the instance modes only")
        if POLICIES[self.policy].timed and self.mode is not EvictionMode.INSTANCE_PRECISE:
            raise ConfigError(f"policy {self.policy} keeps its own limit and watermark: use mode instance_precise")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the inverse of :meth:`from_dict`)."""
        data = asdict(self)
        data["mode"] = self.mode.value
        data["instance_capacities"] = dict(self.instance_capacities)
        data["policy_params"] = dict(self.policy_params)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplayConfig:
        """Build from a mapping; unknown keys are an error."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown replay settings: {', '.join(unknown)}")
        return cls(**data)


#: ``inserted_blocks`` counts the distinct written keys that were not cached when their
#: write began.
COUNTERS = (
    "reads",
    "read_blocks",
    "internal_hit_blocks",
    "external_hit_blocks",
    "input_tokens",
    "hit_tokens",
    "external_hit_tokens",
    "written_blocks",
    "inserted_blocks",
)
_CACHED = len(COUNTERS)  # index of the cached-blocks gauge in a window's counter list


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


@dataclass
class Totals:
    """Counters of a replay (whole trace, one instance, or one time window)."""

    reads: int = 0
    read_blocks: int = 0
    internal_hit_blocks: int = 0
    external_hit_blocks: int = 0
    input_tokens: int = 0
    hit_tokens: int = 0
    external_hit_tokens: int = 0
    written_blocks: int = 0
    inserted_blocks: int = 0

    @classmethod
    def of(cls, counts: Sequence[int]) -> Totals:
        """From a counter list in ``COUNTERS`` order."""
        return cls(*counts[: len(COUNTERS)])

    def add(self, other: Totals) -> None:
        """Accumulate ``other`` into this."""
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def hit_blocks(self) -> int:
        return self.internal_hit_blocks + self.external_hit_blocks

    @property
    def block_hit_ratio(self) -> float | None:
        """(internal + external) hit blocks / read blocks."""
        return _ratio(self.hit_blocks, self.read_blocks)

    @property
    def external_block_hit_ratio(self) -> float | None:
        """Blocks served by the simulated cache / read blocks."""
        return _ratio(self.external_hit_blocks, self.read_blocks)

    @property
    def token_hit_ratio(self) -> float | None:
        return _ratio(self.hit_tokens, self.input_tokens)

    @property
    def external_token_hit_ratio(self) -> float | None:
        return _ratio(self.external_hit_tokens, self.input_tokens)

    def to_dict(self) -> dict[str, Any]:
        """Counters plus the derived ratios."""
        data: dict[str, Any] = {name: getattr(self, name) for name in COUNTERS}
        for name in ("block_hit_ratio", "external_block_hit_ratio", "token_hit_ratio", "external_token_hit_ratio"):
            data[name] = getattr(self, name)
        return data


@dataclass(frozen=True)
class WindowStats:
    """One instance during one time window of the replay."""

    instance: str
    start_s: float
    end_s: float
    totals: Totals
    cached_blocks: int


_CSV_COLUMNS = (
    "instance",
    "window_start_s",
    "window_end_s",
    *COUNTERS,
    "block_hit_ratio",
    "external_block_hit_ratio",
    "token_hit_ratio",
    "cached_blocks",
)


@dataclass
class ReplayResult:
    """Totals of a replay, per instance and per time window."""

    config: ReplayConfig
    totals: Totals
    instances: dict[str, Totals]
    windows: list[WindowStats]
    first_timestamp_us: int | None
    last_timestamp_us: int | None
    block_accesses: int  # keys over all records: a REQUEST's read and write count once
    elapsed_s: float

    @property
    def duration_s(self) -> float:
        """Time the trace spans (0 for an empty or instantaneous trace)."""
        if self.first_timestamp_us is None or self.last_timestamp_us is None:
            return 0.0
        return (self.last_timestamp_us - self.first_timestamp_us) / 1e6

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (time windows are in the CSV, not here)."""
        return {
            "config": self.config.to_dict(),
            "totals": self.totals.to_dict(),
            "instances": {name: t.to_dict() for name, t in self.instances.items()},
            "duration_s": self.duration_s,
            "windows": len(self.windows),
            "block_accesses": self.block_accesses,
            "elapsed_s": self.elapsed_s,
        }

    def write_timeseries_csv(self, out: IO[str]) -> None:
        """Per-instance hit rates over time, one row per (instance, window)."""
        writer = csv.writer(out)
        writer.writerow(_CSV_COLUMNS)
        for w in self.windows:
            t = w.totals
            writer.writerow(
                [
                    w.instance,
                    f"{w.start_s:g}",
                    f"{w.end_s:g}",
                    *(getattr(t, name) for name in COUNTERS),
                    *(
                        "" if r is None else f"{r:.6f}"
                        for r in (t.block_hit_ratio, t.external_block_hit_ratio, t.token_hit_ratio)
                    ),
                    w.cached_blocks,
                ]
            )


def read_timeseries_csv(handle: IO[str], config: ReplayConfig) -> ReplayResult:
    """Rebuild a result's windows and per-instance totals from :meth:`write_timeseries_csv`
    output (for plotting a replay that ran elsewhere, e.g. in another Lambda)."""
    windows: list[WindowStats] = []
    instances: dict[str, Totals] = {}
    total = Totals()
    for row in csv.DictReader(handle):
        try:
            totals = Totals(**{name: int(row[name]) for name in COUNTERS})
            window = WindowStats(
                row["instance"],
                float(row["window_start_s"]),
                float(row["window_end_s"]),
                totals,
                int(row["cached_blocks"]),
            )
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"not a time-series CSV of the optimizer: {exc}") from None
        windows.append(window)
        instances.setdefault(window.instance, Totals()).add(totals)
        total.add(totals)
    return ReplayResult(config, total, instances, windows, None, None, 0, 0.0)


_READ, _WRITE, _PREFIX = Op.READ, Op.WRITE, Query.PREFIX_MATCH


class _Instance:
    __slots__ = ("name", "policy", "limit", "window", "bucket")

    def __init__(self, name: str, policy: EvictionPolicy, limit: int) -> None:
        self.name = name
        self.policy = policy
        self.limit = limit
        self.window: int | None = None
        self.bucket: list[int] = []


def _is_masked(mask: int | tuple[bool, ...], index: int) -> bool:
    if isinstance(mask, int):
        return index < mask
    return index < len(mask) and mask[index]


def _masked_count(mask: int | tuple[bool, ...], n: int) -> int:
    return min(mask, n) if isinstance(mask, int) else sum(mask[:n])


def _rightmost_window(cached: list[bool], size: int) -> int | None:
    """Start of the right-most run of ``size`` cached keys (KVCM's reverse-roll search)."""
    if size < 1 or size > len(cached):
        return None
    base = len(cached) - size
    while base >= 0:
        for offset in range(size):
            if not cached[base + offset]:
                base -= size - offset
                break
        else:
            return base
    return None


#: Builds an instance's cache from its seed (the tiered replay passes one, :mod:`.tiered`).
PolicyFactory = Callable[[int], EvictionPolicy]


class Replayer:
    """Stateful replay; ``step`` one record at a time or ``run`` a whole stream.

    ``policy_factory`` replaces the configured policy by another cache per instance (given
    the instance's seed), e.g. several tiers behind one :class:`EvictionPolicy`."""

    def __init__(self, config: ReplayConfig, policy_factory: PolicyFactory | None = None) -> None:
        self.config = config
        self._policy_factory = policy_factory
        self._mode = config.mode
        self._instances: dict[str, _Instance] = {}
        self._order: list[_Instance] = []
        self._cursor = 0
        self._group_blocks = 0
        self._window_us = max(1, int(round(config.window_s * 1e6)))
        self._windows: dict[tuple[str, int], list[int]] = {}
        self._first: int | None = None
        self._last: int | None = None
        self._accesses = 0
        # hot-path copies of config fields (attribute chains cost on every record)
        self._block_size = config.block_size
        self._refresh = config.read_refresh
        self._precise = config.mode is EvictionMode.INSTANCE_PRECISE

    def policy(self, instance: str) -> EvictionPolicy:
        """The policy (cache state) of an instance seen so far."""
        return self._instances[instance].policy

    @property
    def instance_names(self) -> list[str]:
        return [state.name for state in self._order]

    def _instance(self, name: str) -> _Instance:
        config = self.config
        # every instance gets its own seed stream, so adding an instance never changes
        # the random draws of another one
        seed = config.seed * 65_537 + len(self._order)
        if self._policy_factory is not None:
            policy = self._policy_factory(seed)
        else:
            policy = make_policy(config.policy, seed=seed, **config.policy_params)
        state = _Instance(name, policy, config.instance_capacities.get(name, config.capacity))
        self._instances[name] = state
        self._order.append(state)
        return state

    def run(self, records: Iterable[Record]) -> ReplayResult:
        """Replay every record and return the result."""
        started = time.perf_counter()
        step = self.step
        with gc_paused():
            for record in records:
                step(record)
        return self.result(time.perf_counter() - started)

    def step(self, record: Record) -> None:
        """Apply one record."""
        instance, ts, op, keys, mask, input_tokens, query, sw_size = record
        state = self._instances.get(instance) or self._instance(instance)
        if self._first is None:
            self._first = self._last = ts
        elif ts > self._last:  # type: ignore[operator]
            self._last = ts
        window = (ts - self._first) // self._window_us
        policy = state.policy
        if policy.timed:
            policy.advance(ts)
        if window != state.window:
            if state.bucket:  # the window it leaves ends with the cache as it is now
                state.bucket[_CACHED] = len(policy)
            bucket = self._windows.get((instance, window))
            if bucket is None:
                bucket = self._windows[(instance, window)] = [0] * (_CACHED + 1)
            state.window, state.bucket = window, bucket
        bucket = state.bucket
        n = len(keys)
        self._accesses += n
        if op is not _WRITE:  # identity tests: IntFlag's & is slow Python code
            if not mask and query is _PREFIX:
                internal, external = 0, policy.match_prefix(keys)
                if external:
                    refresh = self._refresh and (op is _READ or not policy.refresh_on_write)
                    if policy.observes_hits:
                        policy.hit(keys[:external], refresh)
                    elif refresh:  # the hot path of a plain policy: no call through hit
                        policy.touch(keys[:external])
            else:
                internal, external = self._general_read(
                    policy, keys, mask, query, sw_size, self._refresh and (op is _READ or not policy.refresh_on_write)
                )
            block_size = self._block_size
            tokens = input_tokens or n * block_size
            hit_tokens = min((internal + external) * block_size, tokens)
            bucket[0] += 1
            bucket[1] += n
            bucket[2] += internal
            bucket[3] += external
            bucket[4] += tokens
            bucket[5] += hit_tokens
            bucket[6] += hit_tokens - min(internal * block_size, tokens)
        if op is not _READ:
            if op is _WRITE and mask:
                self._write_partial(state, bucket, keys, mask)
            else:
                added = state.policy.insert(keys, state.limit if self._precise else None)
                bucket[7] += n
                bucket[8] += added
                if not self._precise:
                    self._reclaim(state, added)

    @staticmethod
    def _general_read(
        policy: EvictionPolicy,
        keys: Sequence[int],
        mask: int | tuple[bool, ...],
        query: Query,
        sw_size: int,
        refresh: bool,
    ) -> tuple[int, int]:
        """Reads with a mask or a non-prefix query; returns (internal, external) hit blocks."""
        if query is Query.PREFIX_MATCH:
            hits = []
            for index, key in enumerate(keys):
                if _is_masked(mask, index):
                    continue
                if key not in policy:
                    break
                hits.append(key)
            internal = _masked_count(mask, len(keys))
        elif query is Query.BATCH_GET:  # the mask is ignored, as by KVCM
            hits = [key for key in keys if key in policy]
            internal = 0
        else:
            cached = [key in policy for key in keys]
            start = _rightmost_window(cached, sw_size)
            hits = [] if start is None else list(keys[start : start + sw_size])
            internal = 0
        if hits:
            policy.hit(hits, refresh)
        return internal, len(hits)

    def _write_partial(
        self, state: _Instance, bucket: list[int], keys: Sequence[int], skipped: tuple[bool, ...] | int
    ) -> None:
        """A write whose mask skips some keys: each run of written keys is inserted under
        its true parent, last run first."""
        policy = state.policy
        runs: list[tuple[int, int]] = []
        for index in range(len(keys)):
            if _is_masked(skipped, index):
                continue
            if runs and runs[-1][1] == index:
                runs[-1] = (runs[-1][0], index + 1)
            else:
                runs.append((index, index + 1))
        written_keys = [key for start, end in runs for key in keys[start:end]]
        added = len({key for key in written_keys if key not in policy})
        limit = state.limit if self._precise else None
        for start, end in reversed(runs):
            policy.insert(keys[start:end], limit, keys[start - 1] if start else None)
        bucket[7] += len(written_keys)
        bucket[8] += added
        if not self._precise:
            self._reclaim(state, added)

    def _reclaim(self, state: _Instance, added: int) -> None:
        """The rough modes' check after a write."""
        batch = self.config.batch_size
        if self._mode is EvictionMode.INSTANCE_ROUGH:
            over = len(state.policy) - state.limit
            if over > 0:
                state.policy.evict(-(-over // batch) * batch)
        else:
            self._group_blocks += added
            if self._group_blocks > self.config.capacity:
                self._reclaim_group()

    def _reclaim_group(self) -> None:
        """Round-robin batches over the instances until the group is under capacity."""
        order, capacity, batch = self._order, self.config.capacity, self.config.batch_size
        cursor = self._cursor
        while self._group_blocks > capacity:
            progressed = False
            for _ in range(len(order)):
                evicted = order[cursor].policy.evict(batch)
                cursor = (cursor + 1) % len(order)
                self._group_blocks -= evicted
                progressed = progressed or evicted > 0
                if self._group_blocks <= capacity:
                    break
            if not progressed:
                break
        self._cursor = cursor

    def result(self, elapsed_s: float = 0.0) -> ReplayResult:
        """Totals so far."""
        for state in self._order:
            state.bucket[_CACHED] = len(state.policy)
        window_s = self._window_us / 1e6
        windows: list[WindowStats] = []
        per_instance: dict[str, Totals] = {state.name: Totals() for state in self._order}
        total = Totals()
        for (instance, index), counts in sorted(self._windows.items()):
            totals = Totals.of(counts)
            per_instance[instance].add(totals)
            total.add(totals)
            windows.append(WindowStats(instance, index * window_s, (index + 1) * window_s, totals, counts[_CACHED]))
        return ReplayResult(
            self.config, total, per_instance, windows, self._first, self._last, self._accesses, elapsed_s
        )


def replay(records: Iterable[Record], config: ReplayConfig) -> ReplayResult:
    """Replay ``records`` under ``config``."""
    return Replayer(config).run(records)
