"""Demote instead of delete (docs/tiered-storage.md, "Demote instead of delete"): a reclaim
round's victims on the source storage of a ``demote_on_reclaim`` strategy are copied to its
target with DELETE_SOURCE, the optimizer's ``demote`` (a victim of tier i goes to tier i+1).

The round begins the copy itself, batch by batch (``begin_batch`` with the source's type:
migrate_begin.lua adds the taken bytes to the instance's ``mt:<type>`` in the same step as
the WRITING targets), then, at the round's end, starts one ``tier_copy`` execution per
instance and route under the name its sessions were given (batch i's session is
``<name>-<i>``); the execution's BeginCopy finds each session made and rebuilds its batch
from it. Whatever ends a session (the finish, AbandonCopy, the reaper's expiry, a sharded
part failed) runs finish.lua, which gives the bytes back in the same step: the pending count
is exact by construction from the begin to the end of the copy, with no reservation to
expire. A begin the quotas refuse writes nothing; an execution that cannot be started has
its sessions failed here: either way the reclaimer drops those victims instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..cache.context import InstanceContext
from ..cache.deletion import Deleter
from ..capacity.instance import DemoteStart, Demotion
from ..clock import Clock, now_ms
from ..index import BlockIndex
from ..index.errors import QuotaExceededError
from ..index.migration import MigrationIndex
from ..observability.logging import logger
from ..observability.metrics import MetricsRegistry
from ..protocol.codes import MigrationRetention
from .executions import execution_name
from .migrations import BATCH_SIZE, COPY_EXECUTION_PREFIX, TierCopies, begin_batch

#: Batches one demote execution takes at most; a round demoting more of one instance along
#: one route starts another. Its sessions' deadlines all run from the round's begins, so a
#: batch waiting behind the others (``copy_max_concurrency`` at a time) must still be copied
#: within ``COPY_SESSION_TTL_S``: 8 leaves each batch at least 189 s with a concurrency of 1
#: (a batch of 64 takes seconds: docs/tiered-storage.md, "What a copy costs").
EXECUTION_BATCHES = 8


@dataclass
class _Execution:
    """The sessions a round began for one execution of one instance and route."""

    ctx: InstanceContext
    source: str
    target: str
    name: str
    #: (session id, the batch's keys, blocks taken) per batch, batch i's session first.
    batches: list[tuple[str, list[int], int]] = field(default_factory=list)


class TierDemotions:
    """The reclaimer's ``Demoter``: one ``DemoteRound`` per reclaim round."""

    def __init__(
        self,
        index: BlockIndex,
        migration: MigrationIndex,
        copies: TierCopies,
        deleter: Deleter,
        clock: Clock,
        metrics: MetricsRegistry,
    ) -> None:
        self.index = index
        self.migration = migration
        self.copies = copies
        self.deleter = deleter
        self.clock = clock
        self.metrics = metrics

    def round(self) -> DemoteRound:
        """The demotes of one reclaim round."""
        return DemoteRound(self)


class DemoteRound:
    """Begins a round's demotes as its victims are picked, and starts their executions at
    its end (``start``)."""

    def __init__(self, demotions: TierDemotions) -> None:
        self.demotions = demotions
        self._open: dict[tuple[str, str, str], _Execution] = {}
        self._full: list[_Execution] = []

    def begin(self, ctx: InstanceContext, source: str, target: str, victims: Sequence[tuple[int, int]]) -> Demotion:
        """Begin copying the (block key, SERVING location id) ``victims`` from ``source`` to
        ``target``, in batches of BATCH_SIZE. Returns the blocks taken and those the target
        holds already (begin's outcome ``c``); a batch a quota refuses takes nothing, nor do
        the batches after it (logged)."""
        d = self.demotions
        source_backend, target_backend = ctx.backend(source), ctx.backend(target)
        if source_backend is None or target_backend is None:
            return Demotion()
        tags = {"instance_group": ctx.group.name, "source_storage": source, "target_storage": target}
        demoted: set[int] = set()
        held: set[int] = set()
        for i in range(0, len(victims), BATCH_SIZE):
            chunk = victims[i : i + BATCH_SIZE]
            execution = self._execution(ctx, source, target)
            session_id = f"{execution.name}-{len(execution.batches)}"
            try:
                begun = begin_batch(
                    d.index,
                    d.migration,
                    d.metrics,
                    ctx,
                    target_backend,
                    chunk,
                    session_id,
                    now_ms(d.clock),
                    tags,
                    demoted_type=source_backend.storage_type.name,
                )
            except QuotaExceededError as exc:
                logger.info(
                    "demote refused by a quota; its victims are dropped",
                    extra={"instance_id": ctx.instance_id, "target": target, "blocks": len(chunk), "error": str(exc)},
                )
                break
            held |= {key for (key, _), outcome in zip(chunk, begun.outcomes, strict=True) if outcome == "c"}
            if begun.placements:
                execution.batches.append((session_id, [key for key, _ in chunk], len(begun.placements)))
                demoted |= {placement[0] for placement in begun.placements}
        return Demotion(frozenset(demoted), frozenset(held))

    def _execution(self, ctx: InstanceContext, source: str, target: str) -> _Execution:
        route = (ctx.instance_id, source, target)
        execution = self._open.get(route)
        if execution is None or len(execution.batches) >= EXECUTION_BATCHES:
            if execution is not None:
                self._full.append(execution)
            execution = self._open[route] = _Execution(ctx, source, target, execution_name(COPY_EXECUTION_PREFIX))
        return execution

    def start(self) -> list[DemoteStart]:
        """Start every execution the round's begins made. One StartExecution refuses: its
        sessions are failed (targets DELETING and deleted, bytes given back) and its blocks
        reported ``unstarted``, for the reclaimer to drop."""
        d = self.demotions
        out = []
        for execution in [*self._full, *self._open.values()]:
            if not execution.batches:
                continue
            ctx, keys = execution.ctx, [key for _, batch, _ in execution.batches for key in batch]
            try:
                arn = d.copies.start(
                    ctx,
                    execution.source,
                    execution.target,
                    [batch for _, batch, _ in execution.batches],
                    MigrationRetention.MIGRATION_RETENTION_DELETE_SOURCE,
                    execution.name,
                )
            except Exception as exc:  # noqa: BLE001 - StartExecution refused: the victims are dropped
                logger.warning(
                    "demote not started; its victims are dropped",
                    extra={"instance_id": ctx.instance_id, "execution": execution.name, "error": str(exc)},
                )
                self._fail(execution)
                out.append(DemoteStart(ctx.instance_id, unstarted=frozenset(keys)))
                continue
            taken = sum(count for _, _, count in execution.batches)
            tags = {"instance_group": ctx.group.name, "source_storage": execution.source}
            d.metrics.incr("cache_reclaimer.block_demote_count", taken, tags | {"target_storage": execution.target})
            out.append(DemoteStart(ctx.instance_id, execution_arn=arn))
        self._open, self._full = {}, []
        return out

    def _fail(self, execution: _Execution) -> None:
        """Close sessions no execution will run: their targets turn DELETING (and are
        deleted), their demoted bytes are given back (finish.lua)."""
        d, ctx = self.demotions, execution.ctx
        for session_id, _, taken in execution.batches:
            try:
                done = d.migration.finish_copy(ctx.layout, session_id, [False] * taken, ctx.spec_layout.sizes)
                d.deleter.submit(ctx, done.victims)
            except Exception:  # noqa: BLE001 - the reaper fails it at its deadline
                logger.warning("demote session not failed", extra={"session_id": session_id}, exc_info=True)
