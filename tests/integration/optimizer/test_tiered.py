"""The tiered replay on the shared conversation trace, against the single-tier replay."""

from __future__ import annotations

from chalicelib.optimizer.replay import ReplayConfig, replay
from chalicelib.optimizer.tiered import Strategy, TieredConfig, TierSpec, tiered_replay


def test_two_tiers_against_the_single_tier_replay(conversation):
    hot, cold = TierSpec("mem", 5000), TierSpec("s3", 20000)
    small = replay(conversation, ReplayConfig(capacity=5000, block_size=512)).totals
    large = replay(conversation, ReplayConfig(capacity=20000, block_size=512)).totals
    # an empty second tier: the single-tier replay, exactly
    for strategy in Strategy:
        alone = tiered_replay(conversation, TieredConfig((hot, TierSpec("s3", 0)), strategy, block_size=512))
        assert alone.replay.totals == small
    # write-through with LRU: the larger tier alone (the README's 0.28782 at 20,000 blocks)
    through = tiered_replay(conversation, TieredConfig((hot, cold), Strategy.WRITE_THROUGH, block_size=512))
    assert through.replay.totals == large and round(through.hit_ratio or 0, 5) == 0.28782
    # demote keeps what the hot tier drops: more hits than the larger tier alone, the hot
    # tier's share that of the hot tier alone (a request's write refreshes all its blocks)
    demote = tiered_replay(conversation, TieredConfig((hot, cold), Strategy.DEMOTE, block_size=512))
    assert (demote.hit_ratio or 0) > (large.external_block_hit_ratio or 0)
    assert demote.tiers[0].hit_blocks == small.external_hit_blocks
    assert sum(t.hit_blocks for t in demote.tiers) == demote.replay.totals.external_hit_blocks
