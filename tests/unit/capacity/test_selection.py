"""The candidate pool: leaves only, expired first, then the policy's worst that help."""

from chalicelib.capacity.policies import LRUPolicy, TTLPolicy
from chalicelib.capacity.selection import CandidatePool
from chalicelib.capacity.watermark import Need

from .test_policies import NOW, cand, keys


def pool_of(*candidates):
    pool = CandidatePool()
    pool.add(candidates)
    return pool


def test_only_leaves_enter_the_pool():
    parent = cand(1, NOW - 100, children=1)
    child = cand(2, NOW - 1, parent=1)
    pool = pool_of(parent, child)
    assert len(pool) == 1
    # the parent is older, yet the child goes first: the parent has a live child
    assert keys(pool.pick(LRUPolicy(), Need(bytes=200), NOW, limit=10, need_limit=10)) == [2]


def test_a_later_sighting_replaces_an_earlier_one():
    pool = pool_of(cand(1, NOW - 100))
    pool.add([cand(1, NOW - 100, children=1)])  # it got a child meanwhile
    assert len(pool) == 0
    pool.add([cand(1, NOW - 5)])
    pool.discard([cand(1, NOW - 5)])
    assert len(pool) == 0


def test_pick_takes_the_worst_until_the_need_is_met():
    pool = pool_of(*(cand(k, NOW - k) for k in range(1, 11)))
    picked = pool.pick(LRUPolicy(), Need(bytes=250), NOW, limit=100, need_limit=100)
    assert keys(picked) == [10, 9, 8]
    assert keys(pool.pick(LRUPolicy(), Need(keys=2), NOW, limit=100, need_limit=100)) == [10, 9]
    # bounded by either limit
    assert keys(pool.pick(LRUPolicy(), Need(bytes=10**6), NOW, limit=2, need_limit=100)) == [10, 9]
    assert keys(pool.pick(LRUPolicy(), Need(bytes=10**6), NOW, limit=100, need_limit=1)) == [10]
    assert pool.pick(LRUPolicy(), Need(), NOW, limit=100, need_limit=100) == []


def test_pick_does_not_change_the_need():
    need = Need(bytes=250)
    pool_of(cand(1), cand(2)).pick(LRUPolicy(), need, NOW, limit=10, need_limit=10)
    assert need == Need(bytes=250)


def test_a_type_need_takes_only_blocks_of_that_type():
    pool = pool_of(cand(1, NOW - 9, storage_type="ST_S3"), cand(2, NOW - 5), cand(3, NOW - 1))
    picked = pool.pick(LRUPolicy(), Need(by_type={"ST_NFS": 150}), NOW, limit=10, need_limit=10)
    assert keys(picked) == [2, 3]


def test_expired_blocks_go_whatever_the_need_and_count_towards_it():
    pool = pool_of(cand(1, NOW - 500), cand(2, NOW - 400), cand(3, NOW - 50), cand(4, NOW - 40))
    policy = TTLPolicy(ttl_s=100)
    assert keys(pool.pick(policy, Need(), NOW, limit=10, need_limit=0)) == [1, 2]
    # two expired blocks (200 bytes) already cover most of a 250-byte need
    assert keys(pool.pick(policy, Need(bytes=250), NOW, limit=10, need_limit=10)) == [1, 2, 3]
    assert keys(pool.pick(policy, Need(), NOW, limit=1, need_limit=0)) == [1]
    assert pool_of(cand(5, NOW - 50)).pick(policy, Need(), NOW, limit=10, need_limit=0) == []
