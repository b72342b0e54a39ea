"""Making room on the write path: a start refused for capacity evicts from its own
instance, then is tried again.

The reclaimer keeps a group under its watermark between rounds, but a cache written
faster than one round frees would refuse writes while it holds blocks its policy would
evict anyway. So a start refused for the instance's own quota, the group quota, a storage
type's quota or the key cap marks victims in the writing instance — chosen as a reclaim
round chooses them (sampled, policy-ordered, leaves first, SERVING only, compare-and-set) —
for the shortfall plus a little headroom, and the start is tried again; when concurrent writers
took the room first, each further attempt frees twice as much. Victims are queued for
deletion (``cache.deletion.QueuedDeleter``): the reclaimer's next round hands them to the
deleter, so a write never waits for a Step Functions call. Marked bytes leave the
live usage the quotas count at once (the index's deleting counters), while the data
is deleted after the group's ``delay_before_delete_ms`` as usual.

The work is bounded per call (``WRITE_PATH_SAMPLING``): a write that cannot be made room
for — everything WRITING, or the space held by other instances of the group — is
refused as before and wakes the reclaimer. A group whose ``used_percentage`` is above 1
has reclaim switched off (upstream's reclaim cases rely on it): nothing is evicted.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from ..clock import Clock
from ..index import BlockIndex
from ..index.errors import QuotaExceededError
from ..observability.logging import logger
from ..protocol.codes import StorageType
from .instance import InstanceReclaim
from .policies import policy_for
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
#: Freed beyond the shortfall, in % of the limit (whole blocks, rounded down), so that
#: the next writes fit too.
HEADROOM_PERCENT = 1


class WritePathEviction:
    """``eviction(ctx, refusal) -> bytes marked``: called by the cache service when a
    start is refused for capacity; never raises (a failure means "no room made")."""

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

    def __call__(
        self,
        ctx: InstanceContext,
        refusal: QuotaExceededError,
        attempt: int = 0,
        protected: frozenset[int] = frozenset(),
    ) -> int:
        """Mark victims for ``refusal`` (the ``attempt``-th for this write), never one of
        ``protected`` (the write's own keys: its prefix is in use); returns bytes marked."""
        need = self._need(ctx, refusal, 1 << attempt)
        if need is None or Limits.of(ctx.group).used_fraction > 1:
            return 0
        strategy = ctx.group.cache_config.reclaim_strategy if ctx.group.cache_config is not None else None
        delay_ms = strategy.delay_before_delete_ms if strategy is not None else 0
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
                submitter(
                    self.deleter,
                    self.clock,
                    ctx.group.name,
                    delay_ms,
                    self.events,
                    self.metrics,
                    "cache_reclaimer.write_path_evict_count",
                ),
                blocks_hint=0,
                protected=protected,
            )
            return work.run().bytes
        except Exception as exc:  # noqa: BLE001 - the refusal stands; the reclaimer follows
            logger.warning(
                "could not make room on the write path",
                extra={"instance_id": ctx.instance_id, "error": f"{type(exc).__name__}: {exc}"},
            )
            return 0

    @staticmethod
    def _need(ctx: InstanceContext, refusal: QuotaExceededError, scale: int) -> Need | None:
        """``scale`` times the refusal's shortfall plus ``HEADROOM_PERCENT`` of its limit."""
        shortfall = scale * max(1, refusal.shortfall)
        block = max(1, ctx.spec_layout.sizes[0])

        def headroom(limit: int, unit: int) -> int:
            return math.floor(limit * HEADROOM_PERCENT / 100 / unit) * unit

        if refusal.kind == "instance":
            return Need(bytes=shortfall + headroom(ctx.instance_capacity, block))
        if refusal.kind == "group":
            return Need(bytes=shortfall + headroom(ctx.group_capacity, block))
        if refusal.kind == "keys":
            return Need(keys=shortfall + headroom(ctx.max_key_count, 1))
        if refusal.kind == "type":
            capacity = ctx.type_capacity(StorageType[refusal.storage_type])
            return Need(by_type={refusal.storage_type: shortfall + headroom(capacity, block)})
        return None
