"""Tiered Copy as a durable ``tier_copy`` execution (issue 24; docs/tiered-storage.md).

An execution takes one instance's block keys for one route (source storage → target
storage) in batches; per batch its Map runs ``begin`` (``MigrationIndex.begin_copy``:
WRITING targets, quota-checked, in a write session), ``copy`` (``copy_blocks``), then
``finish`` (``MigrationIndex.finish_copy``; with DELETE_SOURCE the served blocks' sources go
to deletion). Each step is safe to run again (the state machine retries them): a begin finds
its session already made, a copy writes the same bytes to the same places, a finish finds its
session closed and reads the outcome from the records.

Metrics (upstream's ``migration.*``, one task = one block), tagged ``instance_group``,
``source_storage`` and ``target_storage``: ``migration.tasks_submitted_total`` (blocks a
begin took or refused), ``migration.tasks_completed_total{status}`` (``success``: the target
serves; ``failed``: its source changed during the copy; ``abandoned``: the copy failed for
good; ``refused``: over a quota), ``migration.copy_bytes_total`` (bytes of the served
targets) and the gauge ``migration.copy_duration_ms`` (begin to finish of the last batch
that served). Each is counted by the step whose Valkey change decided it (a begin that made
its session, a finish that closed it), never by a step run again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..cache.context import InstanceContext
from ..cache.contexts import ContextProvider
from ..cache.deletion import Deleter
from ..cache.marks import mark_clearing, record_marks, spec_group_coverage
from ..cache.service import addresses_by_location
from ..clock import Clock, now_ms
from ..index import BlockIndex, Status
from ..index.errors import QuotaExceededError, WriteSessionError
from ..index.migration import CopyBegun, CopyQuotas, CopyTarget, MigrationIndex
from ..index.records import BlockRecord, LocationRecord
from ..index.types import MODE_RAW
from ..observability.metrics import MetricsRegistry
from ..protocol.codes import MigrationRetention
from ..protocol.errors import InvalidArgumentError
from ..storage import BlockRef, StorageBackend, copy_blocks
from .executions import StateMachine
from .quarantine import CopyQuarantine, QuarantineFullError

#: Blocks per Map item (one begin/copy/finish) and per execution (its input stays far below 256 KB).
BATCH_SIZE = 64
EXECUTION_SIZE = 4096

#: The Retry every step of workflows/tier_copy.asl.json has, and its steps' TimeoutSeconds
#: (tests/integration/workflows/test_tier_copy.py keeps them equal to the ASL's).
RETRY_MAX_ATTEMPTS = 3
RETRY_INTERVAL_S = 1
RETRY_BACKOFF = 2.0
STEP_TIMEOUT_S = {"CopyBegin": 60, "CopyBytes": 300, "CopyFinish": 60, "CopyQuarantine": 60}
#: Margin for the Map's own scheduling between one step and the next.
SESSION_SLACK_S = 60


def step_budget_s(timeout_s: int) -> float:
    """The longest a step with the ASL's Retry can take: every attempt timing out, and the backoffs."""
    waits = sum(RETRY_INTERVAL_S * RETRY_BACKOFF**attempt for attempt in range(RETRY_MAX_ATTEMPTS))
    return (RETRY_MAX_ATTEMPTS + 1) * timeout_s + waits


#: A Copy session's deadline from its begin: it outlives the copy's and the finish's every
#: retry, so the reaper never fails a target still being copied (it fails one whose
#: execution died, after this).
COPY_SESSION_TTL_S = math.ceil(
    step_budget_s(STEP_TIMEOUT_S["CopyBytes"]) + step_budget_s(STEP_TIMEOUT_S["CopyFinish"]) + SESSION_SLACK_S
)

#: The state machine's TimeoutSeconds: the longest an execution can take with its batches run
#: one at a time (copy_max_concurrency 1), every step of each retried to the end. One still
#: running then is stuck; Step Functions stops it (alarm TierCopyTimeoutsAlarm) and the
#: sessions it left expire with the reaper.
EXECUTION_TIMEOUT_S = math.ceil(
    (EXECUTION_SIZE // BATCH_SIZE) * (step_budget_s(STEP_TIMEOUT_S["CopyBegin"]) + COPY_SESSION_TTL_S)
)


def copy_batches(block_keys: Sequence[int]) -> list[list[int]]:
    """``block_keys`` without repeats in batches of BATCH_SIZE: one Map item each."""
    keys = list(dict.fromkeys(block_keys))
    return [keys[i : i + BATCH_SIZE] for i in range(0, len(keys), BATCH_SIZE)]


class TierCopies:
    """Starts ``tier_copy`` executions."""

    def __init__(self, machine: StateMachine) -> None:
        self.machine = machine

    def submit(
        self,
        ctx: InstanceContext,
        source: str,
        target: str,
        block_keys: Sequence[int],
        retention: MigrationRetention,
    ) -> str:
        """Start one execution copying ``block_keys`` from storage ``source`` to ``target``,
        at most the group's ``copy_max_concurrency`` batches at once (at most
        EXECUTION_SIZE keys: the caller checks); returns its ARN."""
        return self.start(ctx, source, target, copy_batches(block_keys), retention)

    def start(
        self,
        ctx: InstanceContext,
        source: str,
        target: str,
        batches: Sequence[Sequence[int]],
        retention: MigrationRetention,
        execution_name: str = "",
    ) -> str:
        """Start one execution of ``batches`` (each one Map item's keys); returns its ARN.
        ``execution_name``: one whose batches' sessions were begun already (a reclaim's
        demote: the session of batch i is ``<name>-<i>``), else a new one."""
        cache = ctx.group.cache_config
        config = cache.migration_config if cache is not None else None
        return self.machine.start(
            {
                "instance_id": ctx.instance_id,
                "source": source,
                "target": target,
                "retention": retention.name,
                "max_concurrency": (config.copy_max_concurrency if config is not None else None) or 1,
                "batches": [list(batch) for batch in batches],
            },
            execution_name,
        )


#: The name prefix of tier_copy executions (``copy-<random>``, executions.execution_name).
COPY_EXECUTION_PREFIX = "copy"
#: The write session ids of Copy batches begin with this (the reaper tells them apart).
COPY_SESSION_PREFIX = f"{COPY_EXECUTION_PREFIX}-"


def _session_id(event: dict[str, Any]) -> str:
    """``<execution>-<batch>``, from the event alone: a retried begin finds the session its
    first attempt made. An execution not named ``copy-...`` (started by hand) gets the prefix."""
    name = event["execution"]
    if not name.startswith(COPY_SESSION_PREFIX):
        name = COPY_SESSION_PREFIX + name
    return f"{name}-{event['batch']}"


def _route_tags(ctx: InstanceContext, event: dict[str, Any]) -> dict[str, str]:
    return {"instance_group": ctx.group.name, "source_storage": event["source"], "target_storage": event["target"]}


def _count(metrics: MetricsRegistry, name: str, count: int, tags: dict[str, str]) -> None:
    """Add to a counter; none of a kind makes no series (as upstream's counters)."""
    if count:
        metrics.incr(name, count, tags)


def _located(record: BlockRecord | None, location_id: int) -> LocationRecord | None:
    if record is None:
        return None
    return next((loc for loc in record.locations if loc.location_id == location_id), None)


def begin_batch(
    index: BlockIndex,
    migration: MigrationIndex,
    metrics: MetricsRegistry,
    quarantine: CopyQuarantine,
    ctx: InstanceContext,
    target: StorageBackend,
    sources: Sequence[tuple[int, int]],
    session_id: str,
    begun_ms: int,
    tags: dict[str, str],
    demoted_type: str = "",
) -> CopyBegun:
    """``begin_copy`` of one batch of (block key, source location id) to ``target`` under
    the group's, the instance's and the target type's quotas, its session deadline
    ``COPY_SESSION_TTL_S`` after ``begun_ms``, counting ``migration.tasks_submitted_total`` (and the
    refused, re-raising QuotaExceededError, or QuarantineFullError while the group's quarantine is
    at a limit). ``demoted_type``: a reclaim's demote."""
    group_usage = None
    if ctx.group.quota is not None:
        group_usage = index.group_usage([ctx.group.name])[0].live()
    sizes = ctx.spec_layout.sizes
    try:
        quarantine.check_room(ctx)
        begun = migration.begin_copy(
            ctx.layout,
            sources,
            CopyTarget(
                target.name,
                target.storage_type.name,
                target.pack_count,
                addresses_by_location(target),
                ctx.type_capacity(target.storage_type),
            ),
            sizes,
            session_id,
            begun_ms + COPY_SESSION_TTL_S * 1000,
            CopyQuotas(ctx.group_capacity, ctx.instance_capacity, group_usage),
            covers=spec_group_coverage(ctx),
            spec_group_count=len(sizes),
            demoted_type=demoted_type,
        )
    except (QuotaExceededError, QuarantineFullError):
        _count(metrics, "migration.tasks_submitted_total", len(sources), tags)
        _count(metrics, "migration.tasks_completed_total", len(sources), tags | {"status": "refused"})
        raise
    _count(metrics, "migration.tasks_submitted_total", len(begun.placements), tags)
    return begun


class CopyTasks:
    """The Lambda tasks of ``tier_copy``."""

    def __init__(
        self,
        contexts: ContextProvider,
        index: BlockIndex,
        migration: MigrationIndex,
        deleter: Deleter,
        clock: Clock,
        metrics: MetricsRegistry,
        quarantine: CopyQuarantine,
    ) -> None:
        self.contexts = contexts
        self.index = index
        self.migration = migration
        self.deleter = deleter
        self.clock = clock
        self.metrics = metrics
        self.quarantine = quarantine

    def _backend(self, ctx: InstanceContext, name: str) -> StorageBackend:
        backend = ctx.backend(name)
        if backend is None:
            raise InvalidArgumentError(f"storage {name!r} is not a storage of group '{ctx.group.name}'")
        return backend

    def begin(self, event: dict[str, Any]) -> dict[str, Any]:
        """Task BeginCopy: WRITING targets for the batch's blocks whose source serves (all
        or nothing under the quotas: QuotaExceededError; none while the group's quarantine
        is at a limit: QuarantineFullError). Returns the blocks to copy."""
        ctx = self.contexts(event["instance_id"])
        layout = ctx.layout
        target = self._backend(ctx, event["target"])
        self._backend(ctx, event["source"])
        session_id = _session_id(event)
        keys = [int(k) for k in event["block_keys"]]
        session = self.index.session(layout, session_id)
        pairs: list[tuple[int, int | None, int]]  # (key, source location id, target location id)
        if session is None:
            records = self.index.read(layout, keys, MODE_RAW)
            source_index = self._storage_index(ctx, event["source"])
            sources = []
            for key, record in zip(keys, records, strict=True):
                held = self._serving_on(record, source_index) if record is not None else None
                if held is not None:
                    sources.append((key, held.location_id))
            tags = _route_tags(ctx, event)
            begun_ms = now_ms(self.clock)
            begun = begin_batch(
                self.index,
                self.migration,
                self.metrics,
                self.quarantine,
                ctx,
                target,
                sources,
                session_id,
                begun_ms,
                tags,
            )
            pairs = [(key, source, placed) for key, source, placed, _, _ in begun.placements]
        else:  # a retried begin: its first attempt made the session
            pairs = [(key, None, placed) for key, placed in session.entries]
            begun_ms = session.deadline_ms - COPY_SESSION_TTL_S * 1000
        blocks = self._blocks(ctx, event["source"], pairs)
        return {**event, "session_id": session_id, "begun_ms": begun_ms, "blocks": blocks}

    def _storage_index(self, ctx: InstanceContext, name: str) -> int:
        return next((i for i, n in self.index.storage_names(ctx.layout).items() if n == name), 0)

    @staticmethod
    def _serving_on(record: BlockRecord, storage_index: int) -> LocationRecord | None:
        return next(
            (loc for loc in record.locations if loc.storage_index == storage_index and loc.status == Status.SERVING),
            None,
        )

    def _blocks(
        self, ctx: InstanceContext, source_name: str, pairs: Sequence[tuple[int, int | None, int]]
    ) -> list[list[int]]:
        """[key, spec group, source location id, group, slot, target location id, group, slot]
        per block (a source not named: the block's SERVING location on the source storage)."""
        records = self.index.read(ctx.layout, [key for key, _, _ in pairs], MODE_RAW)
        source_index = self._storage_index(ctx, source_name)
        blocks = []
        for (key, source_id, target_id), record in zip(pairs, records, strict=True):
            placed = _located(record, target_id)
            source = _located(record, source_id) if source_id is not None else None
            if source is None and record is not None:
                source = self._serving_on(record, source_index)
            if placed is None or source is None:
                continue  # gone meanwhile: its finish fails it
            blocks.append(
                [key, placed.spec_group, source.location_id, source.group_id, source.slot]
                + [placed.location_id, placed.group_id, placed.slot]
            )
        return blocks

    def copy(self, event: dict[str, Any]) -> dict[str, Any]:
        """Task CopyBytes: the batch's bytes from the source to the targets (StorageError,
        retried, on any failure)."""
        ctx = self.contexts(event["instance_id"])
        slots = ctx.spec_layout.slots
        sources = [BlockRef(ctx.instance_id, b[0], b[2], b[3], b[4], slots(b[1])) for b in event["blocks"]]
        targets = [BlockRef(ctx.instance_id, b[0], b[5], b[6], b[7], slots(b[1])) for b in event["blocks"]]
        copied = 0
        if sources:
            copied = copy_blocks(
                self._backend(ctx, event["source"]), sources, self._backend(ctx, event["target"]), targets
            )
        return {**event, "copied": True, "bytes": copied}

    def hold(self, event: dict[str, Any]) -> dict[str, Any]:
        """Task QuarantineCopy: the copy timed out, its writer may still write the targets:
        the batch is held in quarantine (``CopyQuarantine.hold``) instead of abandoned."""
        return self.quarantine.hold(event)

    def finish(self, event: dict[str, Any]) -> dict[str, Any]:
        """Tasks FinishCopy and AbandonCopy (no ``copied``: the copy failed for good): close
        the session (targets SERVING while their sources serve, the rest to deletion), then
        apply the retention to the served blocks. An abandon whose copy ran for a step
        timeout or more is held instead (``_writer_may_live``)."""
        if self._writer_may_live(event):
            return self.hold(event)
        ctx = self.contexts(event["instance_id"])
        blocks, copied = event.get("blocks", []), bool(event.get("copied"))
        result = {"batch": event["batch"], "session_id": event["session_id"], "copied_bytes": event.get("bytes", 0)}
        session = self.index.session(ctx.layout, event["session_id"])
        served: list[list[int]]
        try:
            if session is None:
                raise WriteSessionError("closed")
            # A target left out of the copy (its block changed before it was read) is not copied.
            in_copy = {b[5] for b in blocks}
            done = self.migration.finish_copy(
                ctx.layout,
                event["session_id"],
                [copied and location in in_copy for _, location in session.entries],
                ctx.spec_layout.sizes,
                mark_clearing(ctx),
            )
            by_target = {location: j for j, (_, location) in enumerate(session.entries)}
            served_at = set(done.served)
            served = [b for b in blocks if by_target.get(b[5]) in served_at]
            # Before the hand-over: a finish run again (the hand-over failed) counts nothing.
            # Nor hands the victims over again: the failed call may have started a deletion
            # that a second one could overlap; they are pending, and the stranded resubmit
            # (capacity/stranded.py) hands them over once lost (docs/tiered-storage.md).
            self._record_finish(ctx, event, served, len(session.entries) - len(served), copied)
            record_marks(self.metrics, ctx, done.marks)
            self.deleter.submit(ctx, done.victims)
        except WriteSessionError:  # a retried finish (or a session the reaper failed): the records say
            records = self.index.read(ctx.layout, [b[0] for b in blocks], MODE_RAW)
            served = [
                b
                for b, record in zip(blocks, records, strict=True)
                if (loc := _located(record, b[5])) is not None and loc.status == Status.SERVING
            ]
        result |= {"served": len(served), "failed": len(blocks) - len(served)}
        if event["retention"] == MigrationRetention.MIGRATION_RETENTION_DELETE_SOURCE.name and served:
            victims = self.index.mark_deleting(
                ctx.layout,
                [b[0] for b in served],
                ctx.spec_layout.sizes,
                expected_locations=[b[2] for b in served],
                serving_only=True,
            )
            self.deleter.submit(ctx, victims, delay_ms=ctx.delete_delay_ms)
            result["sources_deleted"] = len(victims)
        return result

    def _writer_may_live(self, event: dict[str, Any]) -> bool:
        """Whether an abandoned batch's copy may have had an attempt that timed out: the
        Catch sees the last attempt's error only, and an earlier one timing out took the
        CopyBytes TimeoutSeconds at least, its writer perhaps still running."""
        if event.get("copied") or "error" not in event or "begun_ms" not in event:
            return False
        return now_ms(self.clock) - int(event["begun_ms"]) >= STEP_TIMEOUT_S["CopyBytes"] * 1000

    def _record_finish(
        self, ctx: InstanceContext, event: dict[str, Any], served: list[list[int]], unserved: int, copied: bool
    ) -> None:
        """The outcomes of the targets of a session this finish closed."""
        tags = _route_tags(ctx, event)
        _count(self.metrics, "migration.tasks_completed_total", len(served), tags | {"status": "success"})
        status = "failed" if copied else "abandoned"
        _count(self.metrics, "migration.tasks_completed_total", unserved, tags | {"status": status})
        if served:
            slots = ctx.spec_layout.slots
            served_bytes = sum(spec.size for b in served for spec in slots(b[1]))
            self.metrics.incr("migration.copy_bytes_total", served_bytes, tags)
            if "begun_ms" in event:
                self.metrics.gauge("migration.copy_duration_ms", now_ms(self.clock) - event["begun_ms"], tags)
