"""Background GC (UPSTREAM_V2 §2.12): locations nothing else would ever remove.

Two kinds, found by a slow scan of every instance:

- **orphan WRITING**: a location still WRITING ``orphan_grace_s`` after its record was
  written (a write whose session was lost: a crashed engine, a reaper that never ran).
  One whose write session is still open is never taken (the reaper closes those). The
  grace is at least an hour and at least the longest write session
  (``max_write_timeout_s``), so a session old enough can no longer be finished;
- **storage missing**: a SERVING location whose backend definitively reports its data
  gone (``StorageBackend.might_exist`` False; unknown answers keep the location). Probes
  go per storage in chunks of ``PROBE_CHUNK``. Event-report locations are excluded.

The scan reads ``BUCKETS_PER_PAGE`` occupied buckets of an instance at a time (HGETALL: no
access time or LFU counter is touched) and moves on to the next instance, in (group,
instance) order, ``PAGES_PER_RUN`` pages per run; each instance's SSCAN cursor and the
rotation persist in Valkey (``stores.gc_state``), so successive runs on any node cover
every instance. A round ends when every instance's pass is over; the GC then pauses for
``round_pause_s``. Candidates go through the usual deletion path: marked DELETING by the
mark script with a compare on the exact location id (SERVING ones only for a missing
storage), then handed to the deleter after the group's delete delay.

Runs only under the background lease. Metrics: ``cache_gc.*`` (docs/capacity-and-removal.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..clock import Clock
from ..index import BlockIndex, Status
from ..index.records import BlockRecord, LocationRecord, decode_record
from ..observability.logging import logger
from ..protocol.errors import InstanceNotFoundError
from ..storage.base import BlockRef
from ..stores.gc_state import GcStateStore
from ..stores.lease import Lease
from .reclaimer import LeaseGuard

if TYPE_CHECKING:
    from ..cache.context import InstanceContext
    from ..cache.deletion import Deleter
    from ..control.records import InstanceRecord
    from ..observability.metrics import MetricsRegistry

#: SERVING locations by storage index, each with its block key.
_Serving = dict[int, list[tuple[int, LocationRecord]]]
#: The shortest orphan grace: write sessions last at most an hour by default.
MIN_ORPHAN_GRACE_S = 3600
#: Occupied buckets read per visit of an instance, and visits per run.
BUCKETS_PER_PAGE = 64
PAGES_PER_RUN = 16
#: Locations per existence probe call.
PROBE_CHUNK = 512
#: Consecutive failed visits after which an instance sits the rest of the round out.
MAX_VISIT_FAILURES = 3
ORPHAN_WRITING = "orphan_writing"
STORAGE_MISSING = "storage_missing"


class CacheGcConfigError(ValueError):
    """The GC's settings cannot work (a grace shorter than a write session may last)."""


class InstanceListing(Protocol):
    def list_instances(self) -> list[InstanceRecord]:
        """Every instance record (``group``, ``instance_id``)."""


@dataclass
class GcReport:
    """One run."""

    skipped: str = ""
    visits: list[str] = field(default_factory=list)
    scanned_keys: int = 0
    candidates: dict[str, int] = field(default_factory=lambda: {ORPHAN_WRITING: 0, STORAGE_MISSING: 0})
    deleted: int = 0
    errors: list[str] = field(default_factory=list)
    round_finished: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "skipped": self.skipped,
            "visits": self.visits,
            "scanned_keys": self.scanned_keys,
            "candidates": dict(self.candidates),
            "deleted": self.deleted,
            "errors": self.errors,
            "round_finished": self.round_finished,
        }


@dataclass(frozen=True)
class _Found:
    """A candidate location: block key and location id."""

    block_key: int
    location_id: int


class CacheGarbageCollector:
    """The ``cache_gc`` schedule's work (module docstring)."""

    def __init__(
        self,
        lease: Lease,
        control: InstanceListing,
        index: BlockIndex,
        contexts: Callable[[str], InstanceContext],
        deleter: Deleter,
        state: GcStateStore,
        clock: Clock,
        metrics: MetricsRegistry,
        orphan_grace_s: int,
        round_pause_s: int,
        longest_session_s: int = 0,
        enabled: bool = True,
    ) -> None:
        if orphan_grace_s < max(MIN_ORPHAN_GRACE_S, longest_session_s):
            raise CacheGcConfigError(
                f"KVCM_CACHE_GC_ORPHAN_GRACE_S must be at least {max(MIN_ORPHAN_GRACE_S, longest_session_s)} s "
                f"(an hour, and the longest write session), got {orphan_grace_s}"
            )
        self.lease = lease
        self.control = control
        self.index = index
        self.contexts = contexts
        self.deleter = deleter
        self.state = state
        self.clock = clock
        self.metrics = metrics
        self.orphan_grace_s = orphan_grace_s
        self.round_pause_s = round_pause_s
        self.enabled = enabled

    def run(self) -> dict[str, Any]:
        """Scan the next pages of the rotation and delete what is garbage; returns the
        run's report (``skipped`` says why it did nothing)."""
        if not self.enabled:
            return GcReport(skipped="the background GC is switched off (KVCM_CACHE_GC)").to_dict()
        guard = LeaseGuard(self.lease, self.clock)
        if not guard.acquire():
            return GcReport(skipped="another node holds the background lease").to_dict()
        now = self.clock.now()
        state = self.state.load()
        if now < state.paused_until_s:
            return GcReport(skipped=f"pausing after a round until {state.paused_until_s:.0f}").to_dict()
        if not state.started_s:
            self.state.start_round(now)
            state.started_s = now
        report = GcReport()
        order = [r.instance_id for r in sorted(self.control.list_instances(), key=lambda r: (r.group, r.instance_id))]
        pending = [i for i in order if i not in state.done]
        while pending and len(report.visits) < PAGES_PER_RUN and guard.held():
            # the first instance after the one visited last, in (group, instance) order
            after = order.index(state.position) + 1 if state.position in order else 0
            instance_id = next(i for i in order[after:] + order[:after] if i in pending)
            report.visits.append(instance_id)
            cursor, failures = state.cursors.get(instance_id, 0), 0
            try:
                cursor = self._visit(instance_id, cursor, report)
            except InstanceNotFoundError:
                cursor = 0  # removed since the listing: its purge deletes everything
            except Exception as exc:  # noqa: BLE001 - one instance must not stop the scan
                failures = state.failures.get(instance_id, 0) + 1
                report.errors.append(f"{instance_id}: {type(exc).__name__}: {exc}")
                self.metrics.incr("cache_gc.operation_error_count", 1, {"stage": "scan"})
                logger.warning("cache gc visit failed", extra={"instance_id": instance_id, "error": str(exc)})
            done = cursor == 0 and failures == 0 or failures >= MAX_VISIT_FAILURES
            self.state.visited(instance_id, cursor, done, failures)
            state.position, state.cursors[instance_id], state.failures[instance_id] = instance_id, cursor, failures
            if done:
                pending.remove(instance_id)
        if not pending:
            self.state.finish_round(now + self.round_pause_s)
            report.round_finished = True
            self.metrics.incr("cache_gc.scan_round_count")
            self.metrics.observe("cache_gc.round_duration_ms", (now - state.started_s) * 1000)
        if report.deleted or report.errors:
            logger.info("cache gc run", extra=report.to_dict())
        return report.to_dict()

    def _visit(self, instance_id: str, cursor: int, report: GcReport) -> int:
        """Scan one page of an instance and hand its garbage to deletion; returns the
        cursor to go on from (0: the instance's pass is over)."""
        ctx = self.contexts(instance_id)
        cursor, buckets = self.index.occupied_page(ctx.layout, cursor, BUCKETS_PER_PAGE)
        records = [(key, decode_record(raw)) for key, raw in self.index.read_buckets(ctx.layout, buckets)]
        report.scanned_keys += len(records)
        self.metrics.incr("cache_gc.scan_key_count", len(records))
        if not records:
            return cursor
        storages = self.index.storage_table(ctx.layout)
        orphans, serving = self._classify(records, storages)
        if orphans:
            open_entries = self.index.open_session_entries(ctx.layout)
            in_session = [f for f in orphans if (f.block_key, f.location_id) in open_entries]
            if in_session:
                self._count_dropped(ORPHAN_WRITING, "session_open", len(in_session))
                orphans = [f for f in orphans if (f.block_key, f.location_id) not in open_entries]
        self._delete(ctx, ORPHAN_WRITING, orphans, serving_only=False, report=report)
        self._delete(ctx, STORAGE_MISSING, self._missing(ctx, serving, storages), serving_only=True, report=report)
        return cursor

    def _classify(
        self, records: Sequence[tuple[int, BlockRecord]], storages: dict[int, tuple[str, str]]
    ) -> tuple[list[_Found], _Serving]:
        """Orphan WRITING locations, and SERVING ones by storage index (to probe)."""
        now_ms = int(self.clock.now() * 1000)
        grace_ms = self.orphan_grace_s * 1000
        orphans: list[_Found] = []
        serving: _Serving = defaultdict(list)
        for key, record in records:
            for location in record.locations:
                if storages.get(location.storage_index, ("", ""))[1].startswith("ST_EVENT_REPORT"):
                    continue  # engine-reported: the reporters' own cleanup covers them
                if location.status == Status.WRITING:
                    # a valid write time in the past, older than the grace
                    if 0 < record.write_time_ms <= now_ms - grace_ms:
                        orphans.append(_Found(key, location.location_id))
                elif location.status == Status.SERVING:
                    serving[location.storage_index].append((key, location))
        return orphans, serving

    def _missing(
        self,
        ctx: InstanceContext,
        serving: _Serving,
        storages: dict[int, tuple[str, str]],
    ) -> list[_Found]:
        """The SERVING locations whose storage says their data is gone (unknown: kept)."""
        missing: list[_Found] = []
        for storage_index, located in serving.items():
            name = storages.get(storage_index, ("", ""))[0]
            backend = ctx.backend(name)
            state = ctx.by_name.get(name)
            if backend is None or (state is not None and not state.available):
                # unknown to this node, or out of service by the health checks: no answer
                self.metrics.incr("cache_gc.storage_probe_count", len(located), {"result": "unknown"})
                continue
            for start in range(0, len(located), PROBE_CHUNK):
                chunk = located[start : start + PROBE_CHUNK]
                refs = [
                    BlockRef(
                        ctx.instance_id,
                        key,
                        loc.location_id,
                        loc.group_id,
                        loc.slot,
                        ctx.spec_layout.slots(loc.spec_group),
                    )
                    for key, loc in chunk
                ]
                try:
                    answers: Sequence[bool | None] = backend.might_exist(refs)
                except Exception as exc:  # noqa: BLE001 - a failing probe is an unknown answer
                    self.metrics.incr("cache_gc.operation_error_count", 1, {"stage": "probe"})
                    logger.warning("cache gc probe failed", extra={"storage": backend.name, "error": str(exc)})
                    answers = [None] * len(refs)
                for result, count in ((True, "present"), (False, "missing"), (None, "unknown")):
                    hits = sum(1 for a in answers if a is result)
                    if hits:
                        self.metrics.incr("cache_gc.storage_probe_count", hits, {"result": count})
                missing += [
                    _Found(key, loc.location_id)
                    for (key, loc), answer in zip(chunk, answers, strict=True)
                    if answer is False
                ]
        return missing

    def _delete(
        self, ctx: InstanceContext, reason: str, found: list[_Found], serving_only: bool, report: GcReport
    ) -> None:
        """Mark ``found`` DELETING, each only while it is the same location (id and, for
        ``serving_only``, still SERVING), and hand what was marked to the deleter."""
        if not found:
            return
        report.candidates[reason] += len(found)
        self.metrics.incr("cache_gc.candidate_count", len(found), {"reason": reason})
        victims = self.index.mark_deleting(
            ctx.layout,
            [f.block_key for f in found],
            ctx.spec_layout.sizes,
            expected_locations=[f.location_id for f in found],
            serving_only=serving_only,
            delay_ms=ctx.delete_delay_ms,
        )
        if len(victims) < len(found):
            self._count_dropped(reason, "changed", len(found) - len(victims))
        if not victims:
            return
        self.metrics.incr("cache_gc.delete_target_count", len(victims))
        try:
            self.deleter.submit(ctx, victims, ctx.delete_delay_ms)
        except Exception as exc:  # noqa: BLE001 - pending: the stranded-deletion recovery hands them over again
            self.metrics.incr("cache_gc.delete_result_count", len(victims), {"status": "failed"})
            self.metrics.incr("cache_gc.operation_error_count", 1, {"stage": "submit"})
            logger.warning(
                "cache gc deletions not handed over",
                extra={"instance_id": ctx.instance_id, "locations": len(victims), "error": str(exc)},
            )
            return
        self.metrics.incr("cache_gc.delete_result_count", len(victims), {"status": "submitted"})
        report.deleted += len(victims)

    def _count_dropped(self, reason: str, cause: str, count: int) -> None:
        self.metrics.incr("cache_gc.candidate_dropped_count", count, {"reason": reason, "cause": cause})
