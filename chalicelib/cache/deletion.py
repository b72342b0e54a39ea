"""Deleting blocks: data on the backend, then compare-and-delete of the metadata.

Order matters. Backends addressed per block (S3, Mooncake, memory pool) lose their data
while the location is still DELETING — a DELETING key cannot be written again, so the
data deleted is never a newer block's. Packed files are deleted after the metadata, once
the index says their last block is gone; until then they sit in the instance's orphan
set, so a crash in between only delays the file deletion.

Locations forgotten by a metadata-only trim (``BlockIndex.forget``) have no record left;
their data is deleted when the instance is removed (``delete_forgotten``), and their
charge released only after it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..index import BlockIndex, Status, Victim
from ..index.records import location_status
from ..index.types import MODE_RAW
from ..storage.base import BlockRef
from .context import InstanceContext


@dataclass(frozen=True)
class DeletionReport:
    requested: int
    claimed: int
    dropped: int
    groups_deleted: int


class Deleter(Protocol):
    """Where deletions go: inline here, a Step Functions execution in the workflows."""

    def submit(self, ctx: InstanceContext, victims: Sequence[Victim], delay_ms: int = 0) -> None: ...


class DeletionService:
    """Runs one batch of deletions for one instance. Idempotent: a retried batch finds
    nothing left to claim and deletes nothing twice."""

    def __init__(self, index: BlockIndex) -> None:
        self.index = index

    def delete(self, ctx: InstanceContext, victims: Sequence[Victim]) -> DeletionReport:
        layout = ctx.layout
        raws = self.index.read_raw(layout, [v.block_key for v in victims], MODE_RAW)
        claimed = [
            v
            for v, raw in zip(victims, raws, strict=True)
            if raw is not None and location_status(raw, v.location_id) == Status.DELETING
        ]
        names = self.index.storage_names(layout) if claimed else {}
        self._delete_data(ctx, claimed, names, whole_groups=False)
        outcome = self.index.drop(layout, claimed, ctx.spec_layout.sizes)
        groups_deleted = self.delete_orphan_groups(ctx, names)
        return DeletionReport(len(victims), len(claimed), outcome.dropped, groups_deleted)

    def delete_forgotten(self, ctx: InstanceContext, count: int) -> int:
        """Delete the data of up to ``count`` forgotten locations of an instance being
        removed, then release their charge; returns how many it took (0: none left). Only for an
        instance with no record left: a packed group's file goes whole, and nothing can
        write the instance again."""
        victims = self.index.forgotten(ctx.layout, count)
        if not victims:
            return 0
        self._delete_data(ctx, victims, self.index.storage_names(ctx.layout), whole_groups=True)
        self.index.release_forgotten(ctx.layout, victims, ctx.spec_layout.sizes)
        return len(victims)

    def _delete_data(
        self, ctx: InstanceContext, victims: Sequence[Victim], names: dict[int, str], whole_groups: bool
    ) -> None:
        """Delete the victims' data on backends addressed per block; with ``whole_groups``,
        the files of their packed groups too (else those wait for the orphan set)."""
        per_storage: dict[str, list[Victim]] = defaultdict(list)
        for v in victims:
            per_storage[names.get(v.storage_index, "")].append(v)
        for name, vs in per_storage.items():
            backend = ctx.backend(name)
            if backend is None or backend.owner_evicted:
                continue
            if backend.pack_count == 0:
                backend.delete([self._ref(ctx, v) for v in vs])
            elif whole_groups:
                backend.delete_groups(ctx.instance_id, sorted({v.group_id for v in vs}), ctx.spec_layout.slots(0))

    def delete_orphan_groups(self, ctx: InstanceContext, names: dict[int, str] | None = None) -> int:
        """Delete the files of packed groups whose last block is gone; returns how many."""
        orphans = self.index.orphan_groups(ctx.layout)
        if not orphans:
            return 0
        names = names if names and all(s in names for s, _ in orphans) else self.index.storage_names(ctx.layout)
        per_storage: dict[int, list[int]] = defaultdict(list)
        for sidx, group in orphans:
            per_storage[sidx].append(group)
        all_specs = ctx.spec_layout.slots(0)
        for sidx, groups in per_storage.items():
            backend = ctx.backend(names.get(sidx, ""))
            if backend is not None and not backend.owner_evicted:
                backend.delete_groups(ctx.instance_id, groups, all_specs)
        self.index.forget_orphan_groups(ctx.layout, orphans)
        return len(orphans)

    @staticmethod
    def _ref(ctx: InstanceContext, v: Victim) -> BlockRef:
        return BlockRef(
            ctx.instance_id, v.block_key, v.location_id, v.group_id, v.slot, ctx.spec_layout.slots(v.spec_group)
        )


class QueuedDeleter:
    """Queues victims in the index for the reclaimer to hand to the real deleter at its
    next round (the write path's evictions: a start must not wait for a Step Functions
    call). The delay runs from the hand-over; a queue lost with its process is pending,
    and recovered once due (``capacity.stranded``)."""

    def __init__(self, index: BlockIndex) -> None:
        self.index = index

    def submit(self, ctx: InstanceContext, victims: Sequence[Victim], delay_ms: int = 0) -> None:
        self.index.queue_deletions(ctx.layout, victims)


class InlineDeleter:
    """Deletes at once, in the calling request (tests; deployments without workflows)."""

    def __init__(self, service: DeletionService) -> None:
        self.service = service

    def submit(self, ctx: InstanceContext, victims: Sequence[Victim], delay_ms: int = 0) -> None:
        if victims:
            self.service.delete(ctx, victims)
