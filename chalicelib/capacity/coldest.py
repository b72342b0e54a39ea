"""The coldest blocks of one storage of an instance, by the reclaim policy's order, from a
sample (never a scan): what a tier trigger and migrateCache's ``rule.sample_count`` move.

The sample is the reclaimer's (``BucketSampler``: random occupied buckets, a round trip per
``buckets_per_trip``), read until it holds about ``oversample`` candidates per block wanted
or the round's bucket budget is spent; the blocks are the policy's first among them. Unlike
reclaim, a block with children qualifies: a copy keeps the block readable, so no prefix
breaks.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from ..index import BlockIndex
from .instance import MIN_DENSITY
from .policies import Candidate, VictimPolicy, policy_for
from .sampling import BucketSampler, SamplingConfig

if TYPE_CHECKING:
    from ..cache.context import InstanceContext


def coldest_blocks(
    index: BlockIndex,
    ctx: InstanceContext,
    storage_name: str,
    count: int,
    now_s: int,
    rng: random.Random,
    absent_from: str = "",
    policy: VictimPolicy | None = None,
    config: SamplingConfig = SamplingConfig(),
) -> list[Candidate]:
    """Up to ``count`` blocks of ``ctx`` with a SERVING location on ``storage_name``, the
    policy's first (coldest) first, from about ``config.oversample`` × ``count`` sampled
    candidates. Blocks with a WRITING location (written, or the source of a running Copy to
    any storage) are left out, and with ``absent_from`` those holding any location on that
    storage (copied there already). ``policy``: the group's reclaim
    policy when None. The candidates carry the location on ``storage_name``."""
    if policy is None:
        cache = ctx.group.cache_config
        policy = policy_for(cache.reclaim_strategy if cache is not None else None, index.LFU_DECAY_S)
    if count <= 0:
        return []
    sampler = BucketSampler(
        index,
        ctx.layout,
        index.storage_table(ctx.layout),
        ctx.spec_layout.sizes,
        rng,
        config,
        storage_name,
        absent_from,
        idle_only=True,
    )
    wanted = min(config.max_pool, config.oversample * count)
    found: dict[int, Candidate] = {}
    blocks = max(1, index.usage([ctx.layout])[0].keys)
    while len(found) < wanted and not sampler.exhausted:
        density = len(found) / sampler.sampled if sampler.sampled else blocks / max(1, sampler.occupied)
        for candidate in sampler.sample(math.ceil((wanted - len(found)) / max(density, MIN_DENSITY))):
            found[candidate.block_key] = candidate
    return policy.order(found.values(), now_s)[:count]
