"""Making room on the write path: a start refused for capacity evicts from its own
instance, then is tried again (``cache.room.RetryWithEviction`` decides when).

The reclaimer keeps a group under its watermark between rounds, but a cache written
faster than one round frees would refuse writes while it holds blocks its policy would
evict anyway. So a start refused for the instance's own quota, the group quota, a storage
type's quota or the key cap marks victims in the writing instance — chosen as a reclaim
round chooses them (sampled, policy-ordered, leaves first, SERVING only, compare-and-set) —
for the shortfall, no more: what the grant will use. Marked bytes leave the live usage the
quotas count at once (the index's deleting counters).

The victims are held (``HeldRoom``) until the start is answered: granted, they are queued
for deletion (``cache.deletion.QueuedDeleter``: the reclaimer's next round hands them to
the deleter, so a write never waits for a Step Functions call, and the data is deleted
after the group's ``delay_before_delete_ms`` as usual); refused, they are restored
(``BlockIndex.restore``) and nothing of the start remains.

The work is bounded per call (``WRITE_PATH_SAMPLING``): a write that cannot be made room
for — everything WRITING, or the space held by other instances of the group — is
refused as before and wakes the reclaimer. A group whose ``used_percentage`` is above 1
has reclaim switched off (upstream's reclaim cases rely on it): nothing is evicted.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..clock import Clock
from ..index import BlockIndex
from ..index.errors import QuotaExceededError
from ..index.layout import StartRefusal
from ..index.records import Victim
from ..observability.logging import logger
from .instance import InstanceReclaim, Submit
from .policies import Candidate, policy_for
from .reclaimer import submitter
from .sampling import BucketSampler, SamplingConfig
from .watermark import Limits, Need

if TYPE_CHECKING:
    from ..cache.context import InstanceContext
    from ..cache.deletion import Deleter
    from ..observability.events import EventLog
    from ..observability.metrics import MetricsRegistry

#: Bounds of one write's eviction: a few round trips of buckets, at most a few thousand
#: victims (a request holds at most ``KVCM_MAX_KEYS_PER_REQUEST`` keys).
WRITE_PATH_SAMPLING = SamplingConfig(max_buckets=256, max_victims=20_000, buckets_per_trip=64)


@dataclass
class HeldRoom:
    """Victims of one eviction, marked DELETING but not handed to deletion yet."""

    index: BlockIndex
    ctx: InstanceContext
    submit: Submit
    taken: list[tuple[Victim, Candidate]] = field(default_factory=list)
    #: Whether the whole need was freed.
    enough: bool = False

    @property
    def bytes(self) -> int:
        return sum(c.size for _, c in self.taken)

    def hold(self, ctx: InstanceContext, taken: Sequence[tuple[Victim, Candidate]]) -> None:
        self.taken += taken

    def keep(self) -> None:
        """Hand the victims to deletion (the start was granted)."""
        if self.taken:
            self.submit(self.ctx, self.taken)
            self.taken = []

    def undo(self) -> None:
        """Restore the victims (the start ends refused)."""
        if self.taken:
            self.index.restore(self.ctx.layout, [v for v, _ in self.taken], self.ctx.spec_layout.sizes)
            self.taken = []


class WritePathEviction:
    """``eviction(ctx)(refusal, protected) -> HeldRoom``: the cache service's ``MakeRoom``
    for one instance; never raises (a failure means "no room made")."""

    def __init__(
        self,
        index: BlockIndex,
        deleter: Deleter,
        clock: Clock,
        events: EventLog | None = None,
        metrics: MetricsRegistry | None = None,
        rng: random.Random | None = None,
        config: SamplingConfig = WRITE_PATH_SAMPLING,
    ) -> None:
        self.index = index
        self.deleter = deleter
        self.clock = clock
        self.events = events
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.config = config

    def __call__(self, ctx: InstanceContext, refusal: QuotaExceededError, protected: frozenset[int]) -> HeldRoom:
        """Mark victims for ``refusal``'s shortfall, never one of ``protected`` (the
        write's own keys: its prefix is in use), and hold them."""
        strategy = ctx.group.cache_config.reclaim_strategy if ctx.group.cache_config is not None else None
        delay_ms = strategy.delay_before_delete_ms if strategy is not None else 0
        room = HeldRoom(
            self.index,
            ctx,
            submitter(
                self.deleter,
                self.clock,
                ctx.group.name,
                delay_ms,
                self.events,
                self.metrics,
                "cache_reclaimer.write_path_evict_count",
            ),
        )
        need = self._need(ctx, refusal)
        if need is None or Limits.of(ctx.group).used_fraction > 1:
            return room
        try:
            sampler = BucketSampler(
                self.index,
                ctx.layout,
                self.index.storage_table(ctx.layout),
                ctx.spec_layout.sizes,
                self.rng,
                self.config,
                strategy.storage_unique_name if strategy is not None else "",
            )
            work = InstanceReclaim(
                self.index,
                ctx,
                policy_for(strategy, self.index.LFU_DECAY_S),
                need,
                sampler,
                self.config,
                int(self.clock.now()),
                room.hold,
                blocks_hint=0,
                protected=protected,
            )
            work.run()
            room.enough = not need.pending
        except Exception as exc:  # noqa: BLE001 - the refusal stands; the reclaimer follows
            logger.warning(
                "could not make room on the write path",
                extra={"instance_id": ctx.instance_id, "error": f"{type(exc).__name__}: {exc}"},
            )
        return room

    @staticmethod
    def _need(ctx: InstanceContext, refusal: QuotaExceededError) -> Need | None:
        """The refusal's shortfall (bytes, blocks, or bytes of a storage type)."""
        shortfall = max(1, refusal.shortfall)
        if refusal.kind in (StartRefusal.INSTANCE, StartRefusal.GROUP):
            return Need(bytes=shortfall)
        if refusal.kind == StartRefusal.KEYS:
            return Need(keys=shortfall)
        if refusal.kind == StartRefusal.TYPE:
            return Need(by_type={refusal.storage_type: shortfall})
        return None
