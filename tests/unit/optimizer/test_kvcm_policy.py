"""The simulated KVCM policy: the live constants, the write path, rounds and watermark,
leaf-first order, the touch interval, LFU and TTL."""

from __future__ import annotations

import pytest

from chalicelib.cache import room
from chalicelib.capacity import eviction, sampling, watermark
from chalicelib.index import BlockIndex
from chalicelib.index.layout import MAX_SPLITS_PER_CALL
from chalicelib.index.types import bucket_index
from chalicelib.optimizer import kvcm_policy
from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.kvcm_policy import KVCMPolicy
from chalicelib.optimizer.policies import make_policy
from chalicelib.optimizer.replay import ReplayConfig, replay
from chalicelib.optimizer.traces import Op, Record
from chalicelib.protocol import models as group_model

S = 1_000_000  # microseconds per second


def test_constants_are_the_live_ones():
    live = sampling.SamplingConfig()
    for name in (
        "oversample",
        "max_pool",
        "buckets_per_trip",
        "max_buckets",
        "max_victims",
        "mark_batch",
        "min_sweep_buckets",
        "max_sweep_buckets",
    ):
        assert getattr(kvcm_policy.ROUND_SAMPLING, name) == getattr(live, name), name
        assert getattr(kvcm_policy.WRITE_PATH_SAMPLING, name) == getattr(eviction.WRITE_PATH_SAMPLING, name), name
    assert kvcm_policy.PRESSURE_HEADROOM_PERCENT == watermark.PRESSURE_HEADROOM_PERCENT
    assert kvcm_policy.MAKE_ROOM_ATTEMPTS == room.RetryWithEviction().evictions
    assert kvcm_policy.FRUITLESS_ATTEMPTS == room.RetryWithEviction().fruitless
    assert kvcm_policy.MIN_DENSITY == __import__("chalicelib.capacity.instance").capacity.instance.MIN_DENSITY
    policy = KVCMPolicy()
    assert policy.headroom_percent == 0  # the write path frees the shortfall alone
    assert policy.touch_interval_s == BlockIndex.TOUCH_INTERVAL_S
    assert policy.lfu_decay_s == BlockIndex.LFU_DECAY_S
    assert policy.used_fraction == group_model.DEFAULT_USED_PERCENTAGE
    assert policy.step_percentage == group_model.DEFAULT_RECLAIM_STEP_PERCENTAGE
    assert policy.period_s == group_model.DEFAULT_TRIGGER_PERIOD_S


def chain(start: int, length: int) -> list[int]:
    return list(range(start, start + length))


def test_buckets_grow_with_the_blocks_as_the_index_grows_them():
    """The simulated buckets split as lua/prelude.lua grow_buckets does: 16 at first, one
    more as the blocks pass RECORDS_PER_BUCKET per bucket, at most MAX_SPLITS_PER_CALL per
    write; each block sits in its key's bucket."""
    per_bucket = BlockIndex.RECORDS_PER_BUCKET
    policy = KVCMPolicy(round_s=1000)
    first = 256 * per_bucket  # wants 256 buckets: a write splits at most MAX_SPLITS_PER_CALL
    assert policy.insert(list(range(0, 7919 * first, 7919)), limit=10**6) == first
    assert policy._bucket_count == 16 + MAX_SPLITS_PER_CALL
    for start in range(1, 31):
        policy.insert([(start * 10**6 + i) * 7919 for i in range(100)], limit=10**6)
    assert policy._bucket_count == -(-(first + 3000) // per_bucket)
    assert all(bucket_index(k, policy._bucket_count) == b for b, keys in policy._buckets.items() for k in keys)
    assert sum(len(keys) for keys in policy._buckets.values()) == first + 3000


def test_a_write_too_big_gets_the_leading_run_that_fits_and_a_refusal_wakes_the_reclaimer():
    policy = KVCMPolicy(round_s=1)
    policy.advance(0)
    assert policy.insert(chain(1, 3), limit=4) == 3
    # 3 cached + 5 new > 4: the write path frees what it can (3), the first 4 new ones fit
    assert policy.insert(chain(100, 5), limit=4) == 4
    assert policy.refused_writes == 0 and len(policy) == 4
    # the write's own blocks are never evicted for it: nothing fits, refused
    assert policy.insert([100, 101, 102, 103, 200], limit=4) == 0
    assert policy.refused_writes == 1 and len(policy) == 4


def test_the_write_path_evicts_least_recent_leaves_first():
    policy = KVCMPolicy(round_s=1000)  # no round in this test
    for second, start in enumerate((10, 20, 30)):
        policy.advance(second * S)
        policy.insert(chain(start, 3), limit=9)
    policy.advance(5 * S)
    policy.touch([10, 11, 12])  # the oldest chain read again
    # 1 new block: shortfall 1 (1 % of 9 is no whole block): the chain at 20's leaf
    policy.insert([40], limit=9)
    assert policy.keys() == {10, 11, 12, 20, 21, 30, 31, 32, 40}
    assert policy.evicted["write_path"] == 1
    # a write never evicts its own keys: the 30 chain extended by two blocks at the limit
    # takes the 20 chain (the least recent leaves), not 32 it is about
    policy.advance(6 * S)
    policy.insert([30, 31, 32, 33, 34], limit=9)
    assert {30, 31, 32, 33, 34} <= policy.keys() and not {20, 21} & policy.keys()


def test_a_block_stored_after_its_child_is_no_leaf():
    """A tier receiving demoted blocks gets a chain coldest first: the leaf before its
    parent. The parent, stored second, has a cached child and is no victim until the child
    goes; then the two go in one eviction, the parent joining the pool once its child went
    (this once left the parent in the pool after it went: a KeyError)."""
    policy = KVCMPolicy(round_s=1000)
    policy.insert([11], limit=10, parent=10)  # the leaf first, its parent not cached
    policy.insert([10], limit=10)
    assert policy.leaves([10, 11]) == [11]
    policy.insert([20, 21, 22], limit=10)
    policy.advance(1 * S)
    policy.touch([20, 21, 22])
    assert policy.evict(2) == 2
    assert policy.keys() == {20, 21, 22}


def test_rounds_keep_the_watermark_one_step_at_a_time():
    policy = KVCMPolicy(round_s=1, period_s=10, used_percentage=0.5, step_percentage=10)
    policy.advance(0)
    for n in range(10):
        policy.insert(chain(1000 * n, 10), limit=100)
    assert len(policy) == 100
    policy.advance(1 * S)  # first look: 100 - 50 over, one step of 10 freed
    assert len(policy) == 90
    policy.advance(2 * S)  # still over and it freed something: looked at again next tick
    assert len(policy) == 80
    policy.advance(10 * S)
    assert len(policy) == 50
    policy.advance(30 * S)
    assert len(policy) == 50 and policy.evicted["round"] == 50


def test_a_woken_round_makes_room_under_the_hard_limit():
    policy = KVCMPolicy(round_s=1, used_percentage=1.0, step_percentage=10, headroom_percent=0)
    policy.advance(0)
    policy.insert(chain(1, 50), limit=50)
    policy._children[50] = 1  # pin the chain: the write path finds no leaf
    assert policy.insert([99], limit=50) == 0 and policy._woken
    del policy._children[50]
    policy.advance(1 * S)  # pressure: one step (5) kept free under the limit
    assert len(policy) == 45


def test_reads_refresh_at_most_once_per_second_and_count_for_lfu():
    policy = KVCMPolicy(order="lfu", round_s=1000, seed=1)
    policy.advance(0)
    policy.insert([1], limit=10)
    policy.insert([2], limit=10)
    for t in range(1, 200):
        policy.advance(t * S)
        policy.touch([1])
        policy.touch([1])  # the same second: no second refresh
    block = policy._entries[1]
    assert block.atime == 199 and block.lfu > kvcm_policy.LFU_INITIAL
    # 2 is less frequently used even though decayed: it goes first
    assert policy.evict(1) == 1 and 1 in policy and 2 not in policy


def test_ttl_expires_blocks_whatever_the_watermark():
    policy = KVCMPolicy(order="ttl", ttl_s=30, round_s=1, period_s=10)
    policy.advance(0)
    policy.insert(chain(1, 3), limit=100)
    policy.advance(20 * S)
    policy.insert(chain(10, 3), limit=100)
    policy.advance(41 * S)  # the first chain idle for 41 s > 30: swept, far under the watermark
    assert policy.keys() == {10, 11, 12}


def test_the_replay_runs_kvcm_with_its_clock():
    # a hot chain every other request, six cold ones in turn: 35 blocks for 20 of room
    records = [Record("a", t * S, Op.REQUEST, chain(0 if t % 2 else 1000 * (t % 7), 5)) for t in range(200)]
    result = replay(records, ReplayConfig(capacity=20, policy="kvcm", block_size=1, policy_params={"round_s": 1}))
    lru = replay(records, ReplayConfig(capacity=20, block_size=1))
    assert 0.45 < result.totals.block_hit_ratio <= lru.totals.block_hit_ratio + 0.05
    # every block read by a request is refreshed by the read (the write does not refresh)
    policy = make_policy("kvcm", round_s=1)
    assert policy.refresh_on_write is False and policy.timed


def test_bad_settings():
    with pytest.raises(ConfigError):
        KVCMPolicy(order="mru")
    with pytest.raises(ConfigError):
        KVCMPolicy(step_percentage=0)
    with pytest.raises(ConfigError):
        ReplayConfig(capacity=10, policy="kvcm", mode="instance_rough")
    with pytest.raises(ConfigError, match="instance_precise"):
        KVCMPolicy().insert([1], limit=None)
