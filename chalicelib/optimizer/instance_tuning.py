"""The per-instance tuning job: each group's quota split among its instances from the
group's own recent event log (issue 16, part 4; docs/optimizer.md "Per-instance tuning").

For every group with a byte quota, a run takes each instance's live hit-ratio curve (the
``hit_curves`` schedule's, kept from the sampled traffic: ``LiveSource``) or, for a group
without one (the hit feed off), builds each instance's exact LRU curve from the last
``tuning.window_seconds`` of the group's event log (``EventLogSource``), and asks
``tuning.recommend`` for a step toward the split of ``quota.capacity`` that maximises the
group's hit ratio (a knapsack over quota granules: cliffs are found), at most
``tuning.max_shift`` of the quota moving per run. The recommendation (what would change,
the expected gain) is written next to the event log and logged; when the group opts in
(``tuning.enabled``) and the expected gain reaches ``tuning.min_gain``, the new
``instance_quotas`` are applied with a versioned group update. A group changed since it
was read is left alone (the next run starts from the new version).

The instances split are those registered in the group that the window saw; registered
instances without traffic in the window keep their quota out of the split. Without
``instance_quotas`` yet, the current split is taken as even (the group quota shared). No
instance is given less than ``FLOOR_SHARE`` of an even share.

Pure logic: the control plane, the event log and the output are injected (no redis, no
boto3 here).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from ..observability.event_store import ObjectStore, group_prefix, read_group_lines
from ..protocol.codes import ReclaimPolicy
from ..protocol.models import CacheConfig, CacheReclaimStrategy, InstanceGroup, TriggerStrategy
from .errors import ConfigError
from .mrc import HitRatioCurve
from .policy_tuning import ReclaimSettings, recommend_ttl, recommend_watermark
from .traces import Record, read_kvcm_events
from .tuning import evaluate, instance_curves, recommend

GRANULES = 200
#: Every instance split keeps at least this share of an even split: one whose traffic
#: changes is never left without room to write (and to show its reuse in the next window).
FLOOR_SHARE = 0.25
#: Tokens per block when an event gives tokens but no keys (KVCM's events carry keys).
EVENT_BLOCK_SIZE = 16
#: Seconds between reclaimer rounds the simulation assumes: app.py's ``reclaim`` schedule.
RECLAIM_ROUND_S = 60.0
#: The reclaim parameter is chosen only from a window holding this many reclaimer looks.
MIN_RECLAIM_LOOKS = 3
_ORDERS = {ReclaimPolicy.POLICY_LFU: "lfu", ReclaimPolicy.POLICY_TTL: "ttl"}  # else lru, the default


class Groups(Protocol):
    """What the job needs of the control plane."""

    def groups(self) -> list[InstanceGroup]:
        """Every instance group, as stored (with its version), ``tuning`` filled in (a
        group without one: the defaults, recommend only)."""

    def block_bytes(self, group: str) -> dict[str, int]:
        """Bytes per block of each instance registered in ``group``."""

    def update(self, group: InstanceGroup, current_version: int) -> bool:
        """Store ``group`` if the stored version is ``current_version``; False on a conflict."""


class Clock(Protocol):
    def now(self) -> float: ...


class Logger(Protocol):
    def info(self, msg: str, *args: Any, **kwargs: Any) -> None: ...

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None: ...


class LiveSource(Protocol):
    """The groups' live hit-ratio curves, and where the job's recommendations go."""

    def curves(self, group: str) -> Mapping[str, HitRatioCurve]:
        """Each instance's live curve (empty: none yet)."""

    def recommend(self, group: str, recommendation: dict[str, Any]) -> None:
        """Keep the group's latest recommendation (getGroupHitCurve serves it)."""


class EventLogSource:
    """A group's events between two times, read from the partitioned event log."""

    def __init__(self, store: ObjectStore, prefix: str = "") -> None:
        self.store = store
        self.prefix = prefix

    def records(self, group: str, start_us: int, end_us: int) -> list[Record]:
        lines = read_group_lines(self.store, self.prefix, group, start_us, end_us)
        if not lines:
            return []
        # The trace reader streams a file (two passes: sessions never finished).
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        try:
            return list(read_kvcm_events(handle.name, block_size=EVENT_BLOCK_SIZE))
        finally:
            os.unlink(handle.name)


@dataclass(frozen=True)
class GroupResult:
    """What a run did for one group."""

    group: str
    status: str  # applied | recommended | conflict | no_quota | no_traffic | below_min_gain
    recommendation: dict[str, Any] | None = None
    output: str = ""

    def summary(self) -> dict[str, Any]:
        rec = self.recommendation or {}
        return {
            "group": self.group,
            "status": self.status,
            "output": self.output,
            "changes": rec.get("changes", {}),
            "expected_gain": rec.get("recommended", {}).get("expected_gain"),
            "reclaim": {
                k: v for k, v in (rec.get("reclaim") or {}).items() if k in ("parameter", "current", "recommended")
            },
        }


def current_quotas(group: InstanceGroup, instances: list[str]) -> dict[str, int]:
    """The quotas of ``instances`` now: their ``instance_quotas``, else an even share of
    what the group's quota leaves after the others' (the group quota shared)."""
    capacity = group.quota.capacity if group.quota is not None else 0
    set_quotas = {i: q for i, q in group.instance_quotas.items() if q > 0}
    unset = [i for i in instances if i not in set_quotas]
    free = max(0, capacity - sum(set_quotas.values()))
    current = {i: set_quotas[i] for i in instances if i in set_quotas}
    for n, instance in enumerate(sorted(unset)):
        current[instance] = free // len(unset) + (1 if n < free % len(unset) else 0)
    return current


def used_fraction(group: InstanceGroup) -> float:
    """The share of a quota KVCM keeps (its watermark; 0.9 by default); 1 when reclaim is
    off (a watermark over 1)."""
    strategy = group.cache_config.reclaim_strategy if group.cache_config is not None else None
    trigger = strategy.trigger_strategy if strategy is not None else None
    used = trigger.used_percentage if trigger is not None and trigger.used_percentage > 0 else 0.9
    return min(used, 1.0)


class InstanceTuning:
    """Runs the tuning of every group (``run``); one group at a time (``tune``)."""

    def __init__(
        self,
        groups: Groups,
        events: EventLogSource | None,
        output: ObjectStore | None,
        clock: Clock,
        logger: Logger,
        output_prefix: str = "",
        granules: int = GRANULES,
        reclaim_round_s: float = RECLAIM_ROUND_S,
        live: LiveSource | None = None,
    ) -> None:
        self.live = live
        self.groups = groups
        self.events = events
        self.output = output
        self.output_prefix = output_prefix
        self.clock = clock
        self.logger = logger
        self.granules = granules
        self.reclaim_round_s = reclaim_round_s

    def run(self) -> dict[str, Any]:
        """Tune every group; a failing group is logged and the others go on."""
        results = []
        for group in self.groups.groups():
            try:
                results.append(self.tune(group).summary())
            except Exception as exc:  # noqa: BLE001 - one group's failure must not stop the others
                self.logger.warning(
                    "tuning of instance group failed",
                    extra={"group": group.name, "error": f"{type(exc).__name__}: {exc}"},
                )
                results.append({"group": group.name, "status": "error", "error": str(exc)})
        return {"groups": results}

    def tune(self, group: InstanceGroup) -> GroupResult:
        tuning = group.tuning
        if tuning is None:
            raise ConfigError(f"instance group {group.name!r} has no tuning settings (Groups.groups fills them in)")
        capacity = group.quota.capacity if group.quota is not None else 0
        if capacity <= 0:
            return GroupResult(group.name, "no_quota")
        end_us = int(self.clock.now() * 1e6)
        start_us = end_us - tuning.window_seconds * 1_000_000
        # the event log is still what the reclaim parameter's simulation replays
        records = self.events.records(group.name, start_us, end_us) if self.events is not None else []
        sizes = self.groups.block_bytes(group.name)
        live = self.live.curves(group.name) if self.live is not None else {}
        source = live or instance_curves(records, EVENT_BLOCK_SIZE)
        curves: Mapping[str, HitRatioCurve] = {name: curve for name, curve in source.items() if name in sizes}
        if not curves:
            return GroupResult(group.name, "no_traffic")
        used = used_fraction(group)
        current = current_quotas(group, sorted(curves))
        floor = max(1, int(sum(current.values()) * FLOOR_SHARE / len(current)))
        rec = recommend(
            curves,
            current,
            used_fraction=used,
            max_shift=tuning.max_shift,
            granules=self.granules,
            block_bytes=sizes,
            floor=floor,
        )
        gain = rec["recommended"]["expected_gain"]
        quotas = bool(rec["changes"]) and gain >= tuning.min_gain and gain > 0
        # the reclaim parameter is chosen for the quotas in force once this run is applied
        after = rec["recommended"] if quotas else rec["current"]
        limits = {name: quota // sizes[name] for name, quota in after["quotas"].items()}
        reference = evaluate(curves, after["quotas"], used_fraction=1.0, block_bytes=sizes).hit_ratio
        reclaim = self._reclaim(group, [r for r in records if r.instance in curves], limits, reference or 0.0)
        # a reclaim change gains nothing when it trades hits (within tolerance) for room or
        # freshness: a group asking for a min_gain gets only the changes that gain it
        reclaim_moves = reclaim is not None and reclaim["recommended"] != reclaim["current"]
        reclaim_change = reclaim_moves and (tuning.min_gain <= 0 or (reclaim or {})["expected_gain"] >= tuning.min_gain)
        status = "recommended"
        if tuning.enabled and (quotas or reclaim_change):
            status = self._apply(group, rec if quotas else None, reclaim if reclaim_change else None)
        elif tuning.enabled and (rec["changes"] or reclaim_moves):
            status = "below_min_gain"
        rec = {
            "group": group.name,
            "version": group.version,
            "status": status,
            "tuning": tuning.model_dump(),
            "window_us": [start_us, end_us],
            "records": len(records),
            "curves": "live" if live else "event_log",
            "quota_unit": "bytes",
            "reclaim": reclaim,
            **rec,
        }
        output = self._write(group.name, end_us, rec)
        if self.live is not None:
            self.live.recommend(
                group.name,
                {
                    "time_ms": end_us // 1000,
                    "status": status,
                    "quota_bytes": capacity,
                    "hit_ratio": rec["recommended"]["group_hit_ratio"],
                    "current_hit_ratio": rec["current"]["group_hit_ratio"],
                    "instance_quotas": rec["recommended"]["quotas"],
                },
            )
        self.logger.info(
            "instance tuning",
            extra={
                "group": group.name,
                "status": status,
                "changes": rec["changes"],
                "expected_gain": gain,
                "output": output,
            },
        )
        return GroupResult(group.name, status, rec, output)

    def _reclaim(
        self, group: InstanceGroup, records: list[Record], limits: dict[str, int], reference: float
    ) -> dict[str, Any] | None:
        """The TTL (TTL groups) or watermark (LRU, LFU) the group's policy needs at the
        recommended quotas (``policy_tuning``); None when reclaim is off (a watermark > 1)
        or the window spans fewer than ``MIN_RECLAIM_LOOKS`` reclaimer looks."""
        stored = group.cache_config.reclaim_strategy if group.cache_config is not None else None
        strategy = stored or CacheReclaimStrategy()
        trigger = strategy.trigger_strategy or TriggerStrategy()
        used = trigger.used_percentage or 0.9
        settings = ReclaimSettings(
            order=_ORDERS.get(strategy.reclaim_policy, "lru"),
            used_percentage=used,
            step_percentage=strategy.reclaim_step_percentage or 10,
            period_s=strategy.trigger_period_seconds or 10,
            ttl_s=strategy.ttl_seconds,
            round_s=self.reclaim_round_s,
        )
        times = [r.timestamp_us for r in records] or [0]
        looks = (max(times) - min(times)) / 1e6 / max(settings.round_s, settings.period_s)
        if used > 1 or not any(limits.values()) or looks < MIN_RECLAIM_LOOKS:
            return None  # reclaim off, or a window too short to see the reclaimer at work
        if settings.order == "ttl":
            return recommend_ttl(records, limits, settings, EVENT_BLOCK_SIZE)
        return recommend_watermark(records, limits, settings, EVENT_BLOCK_SIZE, reference)

    def _apply(self, group: InstanceGroup, rec: dict[str, Any] | None, reclaim: dict[str, Any] | None) -> str:
        """The recommended quotas and reclaim parameter stored with one versioned update:
        ``applied`` or ``conflict``."""
        updated = group.model_copy(deep=True)
        if rec is not None:
            updated.instance_quotas = {**group.instance_quotas, **rec["recommended"]["quotas"]}
        if reclaim is not None:
            strategy = _strategy(updated)
            if reclaim["parameter"] == "ttl_seconds":
                strategy.ttl_seconds = reclaim["recommended"]
            else:
                strategy.trigger_strategy = strategy.trigger_strategy or TriggerStrategy()
                strategy.trigger_strategy.used_percentage = reclaim["recommended"]
        updated.version = 0  # the stored version + 1
        if self.groups.update(updated, group.version):
            return "applied"
        self.logger.warning(
            "instance group changed since it was read; tuning retries next run",
            extra={"group": group.name, "version": group.version},
        )
        return "conflict"

    def _write(self, group: str, end_us: int, rec: dict[str, Any]) -> str:
        if self.output is None:
            return ""
        when = datetime.fromtimestamp(end_us / 1e6, tz=UTC)
        key = group_prefix(self.output_prefix, group, "tuning") + when.strftime("%Y-%m-%d/%H%M%S") + ".json"
        self.output.put(key, json.dumps(rec, indent=1, sort_keys=True).encode())
        return self.output.uri(key)


def _strategy(group: InstanceGroup) -> CacheReclaimStrategy:
    """The group's reclaim strategy, created empty (the defaults) when it has none."""
    if group.cache_config is None:
        group.cache_config = CacheConfig()
    if group.cache_config.reclaim_strategy is None:
        group.cache_config.reclaim_strategy = CacheReclaimStrategy()
    return group.cache_config.reclaim_strategy
