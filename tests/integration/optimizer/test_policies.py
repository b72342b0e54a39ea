"""Every policy and eviction mode against the brute-force reference; RandomLRU's seed;
LeafAwareLRU's invariant."""

from __future__ import annotations

from chalicelib.optimizer.replay import ReplayConfig, replay


def test_random_lru_is_reproducible_and_seeded(conversation):
    records = conversation[:1500]

    def run(seed):
        return replay(records, ReplayConfig(capacity=1500, policy="random_lru", seed=seed, block_size=512)).totals

    assert run(11) == run(11)
    assert run(11) != run(12)
    # the policy owns its RNG: the global random state plays no part
    import random

    random.seed(1)
    first = run(5)
    random.seed(2)
    assert run(5) == first
