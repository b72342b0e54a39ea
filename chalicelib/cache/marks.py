"""Tiered Marks as the write path and Copy see them (UPSTREAM_V2 §2.11 "Mark";
docs/tiered-storage.md "Mark"): when a finish clears one, and the ``migration.marks_*``
metrics, counted by the step whose script changed the Marks."""

from __future__ import annotations

from ..index.layout import MarkClear
from ..index.types import MarkClearing, MarkCounts
from ..observability.metrics import MetricsRegistry
from ..protocol.codes import MigrationMarkClearPolicy
from .context import InstanceContext


def spec_group_coverage(ctx: InstanceContext) -> bytes:
    """Byte a * n + b is '1' when a location of spec group b holds every spec of spec group a
    (n spec groups, 0 = every spec): whether a location counts for a write of group a."""
    layout = ctx.spec_layout
    names = [{s.name for s in layout.slots(g)} for g in range(len(layout.sizes))]
    return bytes(b"1"[0] if wanted <= held else b"0"[0] for wanted in names for held in names)


def mark_clearing(ctx: InstanceContext) -> MarkClearing:
    """The group's ``mark_clear_policy`` as a finish applies it (default: the next write)."""
    cache = ctx.group.cache_config
    config = cache.migration_config if cache is not None else None
    full = MigrationMarkClearPolicy.MIGRATION_MARK_CLEAR_ON_FULL_BLOCK_COVERED
    if config is not None and config.mark_clear_policy == full:
        return MarkClearing(MarkClear.FULL_BLOCK, spec_group_coverage(ctx))
    return MarkClearing(MarkClear.NEXT_WRITE)


def record_marks(metrics: MetricsRegistry, ctx: InstanceContext, counts: MarkCounts) -> None:
    """Count what one script did to the instance's Marks: ``migration.marks_consumed_total``
    (cleared by a write or Copy on the target), ``migration.marks_expired_total`` (expired
    or malformed, cleared by a start), both tagged ``instance_group``, and the gauge
    ``migration.marks_active{instance_group, instance_id}`` (the instance's Marks after it)."""
    tags = {"instance_group": ctx.group.name}
    if counts.consumed:
        metrics.incr("migration.marks_consumed_total", counts.consumed, tags)
    if counts.expired or counts.malformed:
        metrics.incr("migration.marks_expired_total", counts.expired + counts.malformed, tags)
    if counts.active is not None:
        metrics.gauge("migration.marks_active", counts.active, tags | {"instance_id": ctx.instance_id})
