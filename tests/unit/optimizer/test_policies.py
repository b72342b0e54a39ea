"""Every policy and eviction mode against the brute-force reference; RandomLRU's seed;
LeafAwareLRU's invariant."""

from __future__ import annotations

import pytest

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.policies import LRU, POLICIES, LeafAwareLRU, RandomLRU, make_policy, policy_name
from chalicelib.optimizer.replay import ReplayConfig, Replayer, replay
from chalicelib.optimizer.traces import Op, Record

from .reference import reference_replay
from .synth import random_trace

DETERMINISTIC = ["lru", "leaf_aware_lru", "lfu"]


def engine_state(replayer: Replayer) -> dict[str, set[int]]:
    return {name: replayer.policy(name).keys() for name in replayer.instance_names}


def compare(records, policy, capacity, *, mode="instance_precise", batch=4, read_refresh=True, policy_params=None):
    expected, state, _ = reference_replay(
        records, policy, capacity, mode=mode, batch=batch, block_size=4, read_refresh=read_refresh
    )
    replayer = Replayer(
        ReplayConfig(
            capacity=capacity,
            policy=policy,
            mode=mode,
            batch_size=batch,
            block_size=4,
            read_refresh=read_refresh,
            policy_params=policy_params or {},
        )
    )
    result = replayer.run(records)
    t = result.totals
    got = dict(
        reads=t.reads,
        read_blocks=t.read_blocks,
        internal=t.internal_hit_blocks,
        external=t.external_hit_blocks,
        tokens=t.input_tokens,
        hit_tokens=t.hit_tokens,
        written=t.written_blocks,
        inserted=t.inserted_blocks,
    )
    assert got == expected
    assert engine_state(replayer) == state


@pytest.mark.parametrize("policy", DETERMINISTIC)
@pytest.mark.parametrize("seed", range(4))
def test_request_traces_match_the_reference(policy, seed):
    records = random_trace(seed, requests=120)
    for capacity in (0, 1, 3, 8, 20, 60):
        compare(records, policy, capacity)


@pytest.mark.parametrize("policy", DETERMINISTIC)
@pytest.mark.parametrize("mode", ["instance_precise", "instance_rough", "group_rough"])
@pytest.mark.parametrize("seed", range(3))
def test_mixed_traces_and_modes_match_the_reference(policy, mode, seed):
    records = random_trace(100 + seed, requests=150, mixed=True)
    for capacity in (2, 7, 25):
        for read_refresh in (True, False):
            compare(records, policy, capacity, mode=mode, batch=3, read_refresh=read_refresh)


def test_random_lru_with_many_samples_is_lru():
    # drawing 2000 samples from at most 12 blocks finds the least recent one (p > 1 - 1e-70)
    records = random_trace(7, requests=150, mixed=True)
    for capacity in (3, 12):
        expected, state, _ = reference_replay(records, "lru", capacity, block_size=4)
        replayer = Replayer(
            ReplayConfig(capacity=capacity, policy="random_lru", block_size=4, policy_params={"samples": 2000})
        )
        totals = replayer.run(records).totals
        assert (totals.external_hit_blocks, totals.inserted_blocks) == (expected["external"], expected["inserted"])
        assert engine_state(replayer) == state


def test_random_lru_evicts_from_its_sample():
    policy = RandomLRU(seed=3, samples=1)
    policy.insert([1, 2, 3, 4])
    # with one sample per eviction any block may go, but only cached ones, one at a time
    assert policy.evict(2) == 2 and len(policy) == 2
    assert policy.keys() < {1, 2, 3, 4}
    with pytest.raises(ConfigError):
        RandomLRU(samples=0)


class CheckedLeafAwareLRU(LeafAwareLRU):
    """LeafAwareLRU that checks the invariant at the moment of every eviction."""

    evictions = 0

    def _drop(self, key: int) -> None:
        assert self.tree.is_leaf(key), f"evicting {key} while a child of it is cached"
        type(self).evictions += 1
        super()._drop(key)


@pytest.mark.parametrize("seed", range(12))
def test_leaf_aware_never_evicts_a_block_with_a_cached_child(seed, monkeypatch):
    monkeypatch.setitem(POLICIES, "leaf_aware_lru", CheckedLeafAwareLRU)
    CheckedLeafAwareLRU.evictions = 0
    mixed = seed % 2 == 1
    records = random_trace(500 + seed, requests=200, mixed=mixed, max_new=5)
    mode = ["instance_precise", "instance_rough", "group_rough"][seed % 3]
    replayer = Replayer(ReplayConfig(capacity=9, policy="leaf_aware_lru", block_size=4, mode=mode, batch_size=2))
    parent: dict[int, int | None] = {}
    for record in records:
        before = replayer.policy(record.instance).keys() if record.instance in replayer.instance_names else set()
        replayer.step(record)
        for i, key in enumerate(record.keys):
            parent.setdefault(key, record.keys[i - 1] if i else None)
        policy = replayer.policy(record.instance)
        after = policy.keys()
        # after each step: the radix index matches the cached set ...
        tree = policy.tree
        assert len(tree) == len(after)
        for key in after:
            assert tree.children(key) == sum(1 for k in after if tree.parent(k) == key)
        # ... and, when writes store whole chains, a block cached before the step that is
        # gone now has no cached child (a partial write may legitimately store a child
        # after its parent left, so mixed traces rely on the check at eviction time)
        if not mixed:
            children_cached = {parent[k] for k in after if parent[k] is not None}
            assert not (before - after) & children_cached
    assert CheckedLeafAwareLRU.evictions > 0


def test_leaf_aware_prefers_leaves_over_older_parents():
    policy = LeafAwareLRU()
    policy.insert([1, 2, 3])  # 3 is the only leaf; 1 is the most recent (last-first touch)
    policy.insert([9])
    policy.touch([3])  # the leaf 3 is now the most recent block of the chain
    assert policy.evict(1) == 1
    assert policy.keys() == {1, 2, 3}  # 9 (oldest leaf) went, not 1 or 2 (parents)
    assert policy.evict(3) == 3 and len(policy) == 0


def test_lru_insert_limit_and_prefix_match():
    lru = LRU()
    assert lru.insert([1, 2, 3], limit=2) == 3
    assert lru.keys() == {1, 2}  # 3 was touched first, so it is the least recent
    assert lru.match_prefix([1, 2, 3]) == 2
    assert lru.match_prefix([2, 1]) == 2 and lru.match_prefix([3, 1]) == 0


def test_policy_registry():
    assert set(POLICIES) == {"lru", "random_lru", "leaf_aware_lru", "lfu", "kvcm"}
    assert policy_name("Random-LRU") == "random_lru"
    assert isinstance(make_policy("leaf-aware-lru"), LeafAwareLRU)
    with pytest.raises(ConfigError):
        make_policy("fifo")
    with pytest.raises(ConfigError):
        make_policy("lru", samples=3)


def test_lfu_keeps_frequent_blocks():
    records = [Record("i", t, Op.REQUEST, keys) for t, keys in enumerate([[1], [1], [1], [2], [3], [1], [4]])]
    result = replay(records, ReplayConfig(capacity=2, policy="lfu", block_size=1))
    # 1 stays cached (frequency 3+), so its last two reads hit
    assert result.totals.external_hit_blocks == 3
