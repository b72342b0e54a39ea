"""Victim ranking per policy, TTL expiry, and the record → candidate mapping."""

import pytest

from chalicelib.capacity.policies import Candidate, LFUPolicy, LRUPolicy, TTLPolicy, policy_for
from chalicelib.capacity.sampling import Coverage, SamplingConfig, sweep_buckets, to_candidate
from chalicelib.index import Status
from chalicelib.index.records import location_status
from chalicelib.protocol.codes import ReclaimPolicy
from chalicelib.protocol.models import CacheReclaimStrategy
from tests.fakes.records import record

NOW = 1_000_000


def cand(key, last_access=NOW, lfu=5, children=0, parent=None, size=100, storage_type="ST_NFS"):
    return Candidate(key, key + 1000, parent, children, last_access, lfu, size, storage_type)


def keys(candidates):
    return [c.block_key for c in candidates]


def test_lru_takes_the_least_recently_accessed_first():
    pool = [cand(1, NOW - 5), cand(2, NOW - 50), cand(3, NOW), cand(4, NOW - 50)]
    assert keys(LRUPolicy().order(pool, NOW)) == [2, 4, 1, 3]  # ties by block key


def test_lfu_takes_the_lowest_decayed_counter_first():
    policy = LFUPolicy(decay_s=60)
    hot_long_ago = cand(1, NOW - 600, lfu=12)  # 12 - 600 // 60 = 2
    warm = cand(2, NOW - 30, lfu=4)  # 4
    cold = cand(3, NOW - 10, lfu=3)  # 3
    assert [policy.score(c, NOW) for c in (hot_long_ago, warm, cold)] == [2, 4, 3]
    assert keys(policy.order([hot_long_ago, warm, cold], NOW)) == [1, 3, 2]
    # the counter never decays below zero, and equal counters fall back to recency
    assert policy.score(cand(4, NOW - 10**6, lfu=1), NOW) == 0
    assert keys(policy.order([cand(5, NOW - 1, lfu=3), cand(6, NOW - 9, lfu=3)], NOW)) == [6, 5]


def test_lfu_without_decay_uses_the_raw_counter():
    assert LFUPolicy(decay_s=0).score(cand(1, 0, lfu=7), NOW) == 7


def test_ttl_expires_blocks_idle_longer_than_the_ttl_and_ranks_nearest_expiry_first():
    policy = TTLPolicy(ttl_s=60)
    assert policy.expires
    assert policy.expired(cand(1, NOW - 61), NOW)
    assert not policy.expired(cand(2, NOW - 60), NOW)
    assert keys(policy.order([cand(3, NOW - 10), cand(4, NOW - 40)], NOW)) == [4, 3]
    never = TTLPolicy(ttl_s=0)
    assert not never.expires and not never.expired(cand(5, 0), NOW)
    assert not LRUPolicy().expires and not LRUPolicy().expired(cand(6, 0), NOW)


@pytest.mark.parametrize(
    "policy, expected",
    [
        (ReclaimPolicy.POLICY_UNSPECIFIED, LRUPolicy),
        (ReclaimPolicy.POLICY_LRU, LRUPolicy),
        (ReclaimPolicy.POLICY_LFU, LFUPolicy),
        (ReclaimPolicy.POLICY_TTL, TTLPolicy),
    ],
)
def test_policy_for_a_strategy(policy, expected):
    chosen = policy_for(CacheReclaimStrategy(reclaim_policy=policy, ttl_seconds=30), lfu_decay_s=60)
    assert type(chosen) is expected
    assert type(policy_for(None, 60)) is LRUPolicy
    assert policy_for(CacheReclaimStrategy(reclaim_policy=ReclaimPolicy.POLICY_TTL, ttl_seconds=30), 60).ttl_s == 30


STORAGES = {1: ("nfs_01", "ST_NFS"), 2: ("s3_01", "ST_S3")}


def test_a_record_offers_its_first_serving_location():
    raw = record([(Status.WRITING, 1, 0, 7), (Status.SERVING, 2, 1, 8)], parent=-3, children=2, atime=55, lfu=9)
    assert to_candidate(42, raw, STORAGES, [300, 100]) == Candidate(
        42, 8, -3, 2, 55, 9, 100, "ST_S3", 2, storage_name="s3_01"
    )


@pytest.mark.parametrize("status", [Status.WRITING, Status.DELETING])
def test_writing_and_deleting_locations_are_never_candidates(status):
    assert to_candidate(1, record([(status, 1, 0, 7)]), STORAGES, [300]) is None


def test_the_strategy_storage_restricts_candidates():
    raw = record([(Status.SERVING, 1, 0, 7), (Status.SERVING, 2, 0, 8)])
    assert to_candidate(1, raw, STORAGES, [300], storage_name="s3_01").location_id == 8
    assert to_candidate(1, raw, STORAGES, [300], storage_name="other") is None
    # a spec group beyond the known sizes counts as a whole block
    assert to_candidate(1, record([(Status.SERVING, 1, 5, 7)]), STORAGES, [300, 100]).size == 300


def test_location_status_finds_a_location_by_id():
    raw = record([(Status.DELETING, 1, 0, 7), (Status.SERVING, 2, 0, 2**39 + 8)])
    assert location_status(raw, 7) == Status.DELETING
    assert location_status(raw, 2**39 + 8) == Status.SERVING
    assert location_status(raw, 8) is None
    assert location_status(record([]), 7) is None


def test_sweep_covers_the_instance_in_about_one_ttl():
    config = SamplingConfig(min_sweep_buckets=16, max_sweep_buckets=1024)
    assert sweep_buckets(16384, period_s=10, ttl_s=3600, config=config) == 46  # 16384 * 10 / 3600
    assert sweep_buckets(16384, period_s=10, ttl_s=10**6, config=config) == 16
    assert sweep_buckets(16384, period_s=10, ttl_s=1, config=config) == 1024
    assert sweep_buckets(8, period_s=10, ttl_s=1, config=config) == 8


def test_a_type_over_its_quota_offers_its_own_location_and_the_target_storage_excludes():
    raw = record([(Status.SERVING, 1, 0, 7), (Status.SERVING, 2, 0, 8)])
    assert to_candidate(1, raw, STORAGES, [300]).location_id == 7
    assert to_candidate(1, raw, STORAGES, [300], prefer_types=frozenset({"ST_S3"})).location_id == 8
    assert to_candidate(1, raw, STORAGES, [300], absent_from="s3_01") is None
    writing = record([(Status.SERVING, 1, 0, 7), (Status.WRITING, 2, 0, 8)])
    assert to_candidate(1, writing, STORAGES, [300], absent_from="s3_01") is None  # a copy running there
    assert to_candidate(1, writing, STORAGES, [300], storage_name="nfs_01").location_id == 7
    assert to_candidate(1, writing, STORAGES, [300], storage_name="nfs_01", idle_only=True) is None


def test_a_location_is_covered_by_a_serving_copy_on_a_servable_storage_holding_its_specs():
    # Two spec groups: 0 every spec, 1 a subset; group 0 covers 1, not the reverse.
    coverage = Coverage(frozenset({"nfs_01", "s3_01"}), b"1011", 2)
    full_hot = record([(Status.SERVING, 1, 0, 7), (Status.SERVING, 2, 0, 8)])
    assert to_candidate(1, full_hot, STORAGES, [300, 100], coverage=coverage).covered
    assert not to_candidate(1, full_hot, STORAGES, [300, 100]).covered
    cold_subset = record([(Status.SERVING, 1, 0, 7), (Status.SERVING, 2, 1, 8)])
    assert not to_candidate(1, cold_subset, STORAGES, [300, 100], coverage=coverage).covered
    cold_writing = record([(Status.SERVING, 1, 0, 7), (Status.WRITING, 2, 0, 8)])
    assert not to_candidate(1, cold_writing, STORAGES, [300, 100], coverage=coverage).covered
    unavailable = Coverage(frozenset({"nfs_01"}), b"1011", 2)
    assert not to_candidate(1, full_hot, STORAGES, [300, 100], coverage=unavailable).covered
