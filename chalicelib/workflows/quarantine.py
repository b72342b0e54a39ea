"""The Copy quarantine (docs/tiered-storage.md "Copy quarantine").

A batch whose ``CopyBytes`` ended with a timeout-class error (``TIMEOUT_ERRORS``: Step
Functions stopped waiting, the Lambda may still be running and writing the targets) goes to
the ``QuarantineCopy`` step instead of ``AbandonCopy``: its session is held
(``CopyQuarantineIndex.hold``), its WRITING targets neither served nor deleted nor reaped
nor collected, still counted. It is released (its targets failed and deleted, as AbandonCopy
does) once its writer is certainly dead, ``COPY_WRITER_HARD_TIMEOUT_S`` (the copy_bytes
function's ``lambda_timeout``) plus ``QUARANTINE_MARGIN_S`` after the quarantine began (the
reaper finds the session due then), or earlier by an operator's breakGlassReleaseAsyncCopy.

Metrics, tagged ``instance_group``: ``migration.tasks_completed_total{status="quarantined"}``
(blocks held, with the route's tags, by the step that held them), the gauges
``migration.quarantine_operations`` and ``migration.quarantine_bytes`` (the group's
quarantine after each change) and ``migration.quarantine_released_total{reason}``
(operations released: ``writer_timed_out`` or ``break_glass``).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

from ..cache.context import InstanceContext
from ..cache.contexts import ContextProvider
from ..cache.deletion import Deleter
from ..clock import Clock, now_ms
from ..index import BlockIndex
from ..index.errors import WriteSessionError
from ..index.layout import CopyGuard
from ..index.quarantine import CopyQuarantineIndex, Evidence, QuarantinedOperation, QuarantinePart
from ..index.records import BlockRecord, LocationRecord
from ..index.types import MODE_RAW, InstanceLayout
from ..observability.metrics import MetricsRegistry
from ..protocol.errors import CapacityExceededError, InstanceNotFoundError
from ..protocol.models import AsyncCopyQuarantineRecord

#: The copy_bytes function's hard timeout (.chalice/config.json ``lambda_timeout``, equal to
#: the CopyBytes state's TimeoutSeconds: tests/integration/workflows/test_tier_copy.py): a
#: writer still running when its state timed out is dead this long after.
COPY_WRITER_HARD_TIMEOUT_S = 300
#: Beyond it: the invocation starting after its state did, the clocks apart.
QUARANTINE_MARGIN_S = 60
#: CopyBytes errors after which its writer may still run: the ASL's QuarantineCopy catcher.
TIMEOUT_ERRORS = ("States.Timeout", "Sandbox.Timedout", "Lambda.Unknown")
#: How much of the error's cause a quarantine keeps.
MAX_ERROR_LENGTH = 512


def _located(record: BlockRecord | None, location_id: int) -> LocationRecord | None:
    if record is None:
        return None
    return next((loc for loc in record.locations if loc.location_id == location_id), None)


class ReleaseReason(str, Enum):
    WRITER_TIMED_OUT = "writer_timed_out"
    BREAK_GLASS = "break_glass"


class QuarantineFullError(CapacityExceededError):
    """A Copy begin refused: the group's quarantine is at its copy_max_quarantine_operations
    or copy_max_quarantine_bytes."""


class CopyQuarantine:
    """Holds, lists and releases quarantined Copies."""

    def __init__(
        self,
        contexts: ContextProvider,
        index: BlockIndex,
        quarantine: CopyQuarantineIndex,
        deleter: Deleter,
        clock: Clock,
        metrics: MetricsRegistry,
    ) -> None:
        self.contexts = contexts
        self.index = index
        self.quarantine = quarantine
        self.deleter = deleter
        self.clock = clock
        self.metrics = metrics

    def hold(self, event: dict[str, Any]) -> dict[str, Any]:
        """Task QuarantineCopy: hold the batch's session (the CopyBytes input, with the caught
        ``error``). Safe to run again: a session held already is left as it is."""
        ctx = self.contexts(event["instance_id"])
        operation_id = event["session_id"]
        error = event.get("error") or {}
        evidence = Evidence(
            f"{error.get('Error', '')}: {error.get('Cause', '')}"[:MAX_ERROR_LENGTH],
            [f"{event.get('execution_id') or event['execution']}#{event['batch']}"],
            event["source"],
            event["target"],
        )
        now = now_ms(self.clock)
        release_ms = now + (COPY_WRITER_HARD_TIMEOUT_S + QUARANTINE_MARGIN_S) * 1000
        held = self.quarantine.hold(ctx.layout, operation_id, release_ms, now * 1000, evidence)
        result: dict[str, Any] = {"batch": event["batch"], "session_id": operation_id, "quarantined": 0}
        if held is None:  # finished, or expired and reaped: nothing left to hold
            return result
        held_now, targets = held
        total = self._held_bytes(ctx, targets)
        self.quarantine.add(QuarantinedOperation(operation_id, ctx.group.name, ctx.instance_id, total, len(targets)))
        if held_now and targets:
            tags = {"instance_group": ctx.group.name, "source_storage": event["source"]}
            tags |= {"target_storage": event["target"], "status": "quarantined"}
            self.metrics.incr("migration.tasks_completed_total", len(targets), tags)
        self._gauges(ctx.group.name)
        return result | {"quarantined": len(targets)}

    def _held_bytes(self, ctx: InstanceContext, targets: Sequence[tuple[int, int]]) -> int:
        """Bytes of the (block key, target location id) still in their records."""
        sizes = ctx.spec_layout.sizes
        records = self.index.read(ctx.layout, [key for key, _ in targets], MODE_RAW)
        located = (_located(record, location_id) for (_, location_id), record in zip(targets, records, strict=True))
        return sum(sizes[loc.spec_group] for loc in located if loc is not None)

    def check_room(self, ctx: InstanceContext) -> None:
        """QuarantineFullError when the group's quarantine is at one of its limits
        (``copy_max_quarantine_operations`` / ``_bytes``, when > 0)."""
        cache = ctx.group.cache_config
        config = cache.migration_config if cache is not None else None
        max_operations = (config.copy_max_quarantine_operations or 0) if config is not None else 0
        max_bytes = (config.copy_max_quarantine_bytes or 0) if config is not None else 0
        if max_operations <= 0 and max_bytes <= 0:
            return
        operations = self.quarantine.operations(ctx.group.name)
        if not self._over(operations, max_operations, max_bytes):
            return
        # Before refusing: entries whose release died before taking them out count no more.
        operations = [op for op, _ in self._live(operations)]
        if self._over(operations, max_operations, max_bytes):
            raise QuarantineFullError(
                f"group '{ctx.group.name}' holds {len(operations)} quarantined copies of "
                f"{sum(op.total_bytes for op in operations)} bytes (copy_max_quarantine_operations "
                f"{max_operations}, copy_max_quarantine_bytes {max_bytes}): no new copy until some are released"
            )

    @staticmethod
    def _over(operations: Sequence[QuarantinedOperation], max_operations: int, max_bytes: int) -> bool:
        held = sum(op.total_bytes for op in operations)
        return (0 < max_operations <= len(operations)) or (0 < max_bytes <= held)

    def _live(
        self, operations: Sequence[QuarantinedOperation]
    ) -> list[tuple[QuarantinedOperation, list[QuarantinePart]]]:
        """The listed operations whose session is quarantined, with its parts; the others
        (released by a call that died before taking them out, their instance removed) are
        taken out of the index."""
        layouts: list[InstanceLayout | None] = []
        for op in operations:
            try:
                layouts.append(self.contexts(op.instance_id).layout)
            except InstanceNotFoundError:
                layouts.append(None)
        kept = [(op, layout) for op, layout in zip(operations, layouts, strict=True) if layout is not None]
        parts = self.quarantine.parts([layout for _, layout in kept], [op.operation_id for op, _ in kept])
        live = [
            (op, found)
            for (op, _), found in zip(kept, parts, strict=True)
            if found and all(p.guard == CopyGuard.QUARANTINED for p in found)
        ]
        stale = [op for op in operations if op not in {op for op, _ in live}]
        self.quarantine.forget(stale)
        return live

    def records(self, group: str | None) -> list[AsyncCopyQuarantineRecord]:
        """One record per block of each quarantined operation of ``group`` (None: all)."""
        out = []
        for op, parts in self._live(self.quarantine.operations(group)):
            ctx = self.contexts(op.instance_id)
            pairs = [(t, s, part) for part in parts for t, s in zip(part.targets, part.sources, strict=True)]
            raw = self.index.read(ctx.layout, [key for (key, _), _, _ in pairs], MODE_RAW)
            sizes = ctx.spec_layout.sizes
            for ((key, target_id), (_, source_id), part), record in zip(pairs, raw, strict=True):
                target = _located(record, target_id)
                out.append(
                    AsyncCopyQuarantineRecord(
                        instance_group_name=op.group,
                        instance_id=op.instance_id,
                        block_key=key,
                        target_location_id=str(target_id),
                        guard_state=int(CopyGuard.QUARANTINED),
                        operation_id=op.operation_id,
                        source_location_id=str(source_id),
                        source_location_create_time=record.write_time_ms * 1000 if record else 0,
                        source_storage_name=part.source_storage_name,
                        target_storage_name=part.target_storage_name,
                        total_bytes=sizes[target.spec_group] if target is not None else 0,
                        backend_task_ids=part.backend_task_ids,
                        create_time_us=part.create_time_us,
                        update_time_us=part.update_time_us,
                        last_error=part.last_error,
                    )
                )
        return out

    def guard_of(self, ctx: InstanceContext, operation_id: str) -> CopyGuard | None:
        """The operation's guard state: QUARANTINED when every part of its session is,
        ACTIVE when its session is open and not quarantined, None when there is no session."""
        (parts,) = self.quarantine.parts([ctx.layout], [operation_id])
        if not parts:
            return None
        return CopyGuard.QUARANTINED if all(p.guard == CopyGuard.QUARANTINED for p in parts) else CopyGuard.ACTIVE

    def release(
        self,
        ctx: InstanceContext,
        operation_id: str,
        reason: ReleaseReason,
        guard: CopyGuard = CopyGuard.QUARANTINED,
    ) -> int:
        """Release a quarantined operation: its targets fail and go to deletion, in one step
        per part (finish.lua's CAS on the session and ``guard``: WriteSessionError when it is
        unknown or released already, CopyGuardError when its guard state is another; nothing
        changed then). Returns how many targets failed."""
        session = self.index.session(ctx.layout, operation_id)
        if session is None:
            raise WriteSessionError(f"copy operation {operation_id!r} is unknown or released")
        outcome = self.index.finish(
            ctx.layout,
            operation_id,
            session,
            (),
            ctx.spec_layout.sizes,
            force_fail=True,
            release_guard=guard,
        )
        listed = self.quarantine.find(operation_id)
        self.quarantine.forget([listed or QuarantinedOperation(operation_id, ctx.group.name, ctx.instance_id, 0, 0)])
        tags = {"instance_group": ctx.group.name, "reason": reason.value}
        self.metrics.incr("migration.quarantine_released_total", 1, tags)
        self._gauges(ctx.group.name)
        # After the index: a hand-over that fails leaves the victims pending, and the
        # stranded resubmit hands them over (as a finish's).
        self.deleter.submit(ctx, outcome.victims)
        return len(outcome.victims)

    def release_due(self, ctx: InstanceContext, session_id: str) -> int | None:
        """The reaper's part: release ``session_id`` when it is quarantined and its release
        time has come; returns how many targets failed (0: not due yet, or released
        meanwhile), or None when the session is not quarantined (the reaper expires it)."""
        (parts,) = self.quarantine.parts([ctx.layout], [session_id])
        if not parts or any(p.guard != CopyGuard.QUARANTINED for p in parts):
            return None
        if now_ms(self.clock) < max(p.release_ms for p in parts):
            return 0
        try:
            return self.release(ctx, session_id, ReleaseReason.WRITER_TIMED_OUT)
        except WriteSessionError:  # released meanwhile (break-glass)
            return 0

    def _gauges(self, group: str) -> None:
        operations = self.quarantine.operations(group)
        tags = {"instance_group": group}
        self.metrics.gauge("migration.quarantine_operations", len(operations), tags)
        self.metrics.gauge("migration.quarantine_bytes", sum(op.total_bytes for op in operations), tags)
