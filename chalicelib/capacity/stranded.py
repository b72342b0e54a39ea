"""Deletions whose hand-off was lost, found where they are pending and handed over again.

A location is DELETING from its mark until its deletion drops it: seconds, plus the
delay it was handed over with. When the hand-off is lost (the process died between the
mark and the hand-off, Step Functions refused it, a batch ran out of retries) nothing
else would pick it up again: the key could never be written again and its bytes would
stay counted. So every script that turns a location DELETING also records it in the
instance's pending set (``T:pd``), scored by its deadline — the delay plus
``BlockIndex.DELETION_LOST_AFTER_S`` after the mark — and the script that drops it takes
it out, in the same atomic steps. Ahead of that script, in its pipeline, ``BlockIndex.queue_due``
registers the instance as due at that deadline (``{<prefix>:deletions}:due``, on its own
slot: it cannot move inside an instance's script, hence before it).

A round reads the due registrations, then the overdue entries of their instances, marks
those again (only what is still DELETING under the same id and overdue is taken, pending
anew: a removeCache racing the round cannot hand the same deletion over twice) and hands
them to the deleter. A registration goes once its instance has nothing overdue left: a
location pending for later was registered for its own, later, deadline. So a round costs
what is due, never the number of instances.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..index import BlockIndex
from ..observability.logging import logger
from ..protocol.errors import InstanceNotFoundError

if TYPE_CHECKING:
    from ..cache.context import InstanceContext
    from ..cache.deletion import Deleter
    from ..clock import Clock
    from ..observability.metrics import MetricsRegistry

#: Due registrations read per round, and overdue locations taken per instance shard.
DUE_PER_ROUND = 256
OVERDUE_PER_VISIT = 2048


class StrandedDeletions:
    """Hands lost deletions to the deleter again (a step of every reclaim round)."""

    def __init__(
        self,
        index: BlockIndex,
        contexts: Callable[[str], InstanceContext],
        deleter: Deleter,
        clock: Clock,
        metrics: MetricsRegistry | None = None,
    ) -> None:
        self.index = index
        self.contexts = contexts
        self.deleter = deleter
        self.clock = clock
        self.metrics = metrics

    def recover(self) -> int:
        """One round: returns how many locations were handed over again."""
        now_s = int(self.clock.now())
        total = 0
        for instance_id, members in self.index.due_deletions(now_s, DUE_PER_ROUND).items():
            try:
                total += self._visit(instance_id, members, now_s)
            except Exception as exc:  # noqa: BLE001 - one instance must not stop the round; still due next
                logger.warning(
                    "stranded deletions not recovered", extra={"instance_id": instance_id, "error": str(exc)}
                )
        return total

    def _visit(self, instance_id: str, members: list[bytes], now_s: int) -> int:
        try:
            ctx = self.contexts(instance_id)
        except InstanceNotFoundError:
            self.index.settle_due(members)  # removed: its purge takes every DELETING location
            return 0
        overdue = self.index.overdue_deletions(ctx.layout, now_s, OVERDUE_PER_VISIT)
        handed = self._hand_over(ctx, overdue, now_s) if overdue else 0
        if len(overdue) < OVERDUE_PER_VISIT:
            self.index.settle_due(members)
        return handed

    def _hand_over(self, ctx: InstanceContext, overdue: list[tuple[int, int]], now_s: int) -> int:
        # Pending anew before the hand-off: a failing one is found again a grace later.
        victims = self.index.mark_deleting(
            ctx.layout,
            [key for key, _ in overdue],
            ctx.spec_layout.sizes,
            expected_locations=[location for _, location in overdue],
            resubmit_before_s=now_s,
            lost_only=True,
        )
        if not victims:
            return 0
        try:
            self.deleter.submit(ctx, victims)
        except Exception as exc:  # noqa: BLE001 - one instance's storage must not stop the round
            logger.warning(
                "stranded deletions failed again",
                extra={"instance_id": ctx.instance_id, "locations": len(victims), "error": str(exc)},
            )
            return 0
        if self.metrics is not None:
            self.metrics.incr(
                "cache_reclaimer.stranded_resubmit_count", len(victims), {"instance_group": ctx.group.name}
            )
        return len(victims)
