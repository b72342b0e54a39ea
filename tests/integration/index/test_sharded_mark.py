"""Tiered Mark on an instance spread over three shards of a three-master cluster
(chalicelib/index/migration.py ``mark``, lua/start.lua, lua/finish.lua per shard;
docs/tiered-storage.md "Mark"): one mark step per shard with the target's one storage index,
the next sharded start writing marked keys to the target in every shard, the finish clearing
per policy, an unavailable or full target keeping the Mark, expiry, the counters ('mk')
exact per shard and summed, racing starts writing each marked key once."""

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from chalicelib.index import BlockIndex, Status
from chalicelib.index.errors import InstanceGoneError, QuotaExceededError
from chalicelib.index.layout import RecordFlag
from chalicelib.index.migration import CopyTarget, MigrationIndex
from chalicelib.index.sharding import shard_of
from chalicelib.index.types import MODE_RAW, Candidate, bucket_index

from .test_block_index import SIZES, start
from .test_sharded_instance import keys_of
from .test_tier_mark import COVERS, DAY_MS, FULL, NFS2, S3, finish, mark, now_ms, raw, served, storages

SHARDS = 3


@pytest.fixture
def index(cluster3, clock):
    return BlockIndex(cluster3, "kvcm", clock)


@pytest.fixture
def sharded(index):
    return index.claim("sh", "inc-1", 4, registering=True, shard_count=SHARDS, group="gs")


@pytest.fixture
def migration(index):
    return MigrationIndex(index)


def spread(seed, per_shard):
    """``per_shard`` keys in each shard, shuffled."""
    rng = random.Random(seed)
    keys = [k for s in range(SHARDS) for k in keys_of(rng, per_shard, shard=s)]
    rng.shuffle(keys)
    return keys


def marks_per_shard(index, layout):
    """Each shard's Mark count ('mk')."""
    return [int(index.client.hget(shard.key("u"), "mk") or 0) for shard in layout.shards]


def in_shards(keys):
    """How many of ``keys`` each shard holds."""
    return [sum(1 for k in keys if shard_of(k, SHARDS) == s) for s in range(SHARDS)]


def marked(index, layout, key):
    return bool(raw(index, layout, key)[0] & RecordFlag.MARKED)


def test_marks_in_every_shard_route_the_next_start_to_the_target_and_the_finish_clears_them(index, sharded, migration):
    keys = spread(1, 3)
    served(index, sharded, keys)
    chosen = keys[:6]
    result = mark(migration, sharded, [*chosen, 99])
    assert (result.outcomes, result.active) == ("1" * 6 + "g", 6)
    assert marks_per_shard(index, sharded) == in_shards(chosen) and sum(in_shards(chosen)) == 6
    assert min(in_shards(chosen)) > 0  # every shard holds Marks
    # The target has one storage index, the same in every shard: a Mark means one storage.
    indexes = {int(index.client.hget(shard.key("st"), "n:s3_01")) for shard in sharded.shards}
    assert len(indexes) == 1
    before = [index.usage([shard])[0] for shard in sharded.shards]

    out = start(index, sharded, keys, sid="w1", more_candidates=[S3])
    assert out.written_to == tuple(2 if k in chosen else 0 for k in keys)
    assert (out.marks.routed, out.marks.active, out.created) == (6, 6, 0)
    for s, (was, now) in enumerate(zip(before, [index.usage([shard])[0] for shard in sharded.shards], strict=True)):
        assert (now.bytes - was.bytes, now.keys - was.keys) == (in_shards(chosen)[s] * 200, 0)
        assert now.by_storage.get("s3_01", 0) == in_shards(chosen)[s] * 200
    assert marks_per_shard(index, sharded) == in_shards(chosen)  # kept until the writes finish

    session = index.session(sharded, "w1")
    assert [k for k, _ in session.entries] == chosen  # the request's order across the shards
    failed = chosen[0]
    done = finish(index, sharded, "w1", [k != failed for k in chosen])
    assert (done.marks.consumed, done.marks.active) == (5, 1)
    assert marks_per_shard(index, sharded) == in_shards([failed])
    for key in chosen[1:]:
        assert storages(index, sharded, key) == [("nfs_01", 0, Status.SERVING), ("s3_01", 0, Status.SERVING)]
        assert not marked(index, sharded, key)
    # The failed write keeps its Mark; once its failed location is gone, the next start routes it.
    assert marked(index, sharded, failed)
    index.drop(sharded, done.victims, SIZES)
    again = start(index, sharded, [failed], sid="w2", more_candidates=[S3])
    assert again.written_to == (2,)
    assert finish(index, sharded, "w2", [True]).marks.active == 0
    assert marks_per_shard(index, sharded) == [0, 0, 0]
    assert index.group_usage(["gs"])[0].by_type == {"ST_NFS": 9 * 200, "ST_S3": 6 * 200}


def test_full_block_covered_keeps_each_shards_marks_until_the_target_holds_every_spec(index, sharded, migration):
    keys = spread(2, 2)
    served(index, sharded, keys)
    mark(migration, sharded, keys, target=NFS2)
    # Spec a alone (group 1) on the target covers half of each block: every Mark stays.
    start(index, sharded, keys, sid="w1", spec_groups=[1] * 6, covers=COVERS, more_candidates=[NFS2])
    assert finish(index, sharded, "w1", [True] * 6, clear=FULL).marks.consumed == 0
    assert marks_per_shard(index, sharded) == [2, 2, 2]
    # The whole block (group 0) there clears them, in every shard.
    out = start(index, sharded, keys, sid="w2", covers=COVERS, more_candidates=[NFS2])
    assert out.written_to == (2,) * 6
    done = finish(index, sharded, "w2", [True] * 6, clear=FULL)
    assert (done.marks.consumed, done.marks.active) == (6, 0)
    assert marks_per_shard(index, sharded) == [0, 0, 0]


def test_a_target_not_offered_or_full_gets_a_normal_write_and_keeps_the_marks(index, sharded, migration):
    keys = spread(3, 2)
    served(index, sharded, keys)
    mark(migration, sharded, keys)
    # s3_01 not among the candidates (disabled, unhealthy, not a candidate): masked as before.
    out = start(index, sharded, keys, sid="w1")
    assert out.new_flags == [False] * 6 and out.marks.routed == 0 and out.marks.active is None
    # s3_01 offered with room for one block of its type. The group's type quota is checked in
    # each shard against its own counters (the group's bytes not read here): each shard routes
    # its first marked key, the other one is not written and keeps its Mark.
    full = Candidate("s3_01", "ST_S3", 0, 200, -1, False)
    out = start(index, sharded, keys, sid="w2", more_candidates=[full])
    firsts = {next(k for k in keys if shard_of(k, SHARDS) == s) for s in range(SHARDS)}
    assert out.written_to == tuple(2 if k in firsts else 0 for k in keys)
    assert [index.usage([shard])[0].by_type.get("ST_S3") for shard in sharded.shards] == [200] * 3
    assert marks_per_shard(index, sharded) == [2, 2, 2] and out.marks.active == 6
    assert all(marked(index, sharded, k) for k in keys)


def test_expired_and_malformed_marks_are_cleared_in_their_shards(index, sharded, migration):
    keys = spread(4, 2)
    served(index, sharded, keys)
    by_shard = [[k for k in keys if shard_of(k, SHARDS) == s] for s in range(SHARDS)]
    short = by_shard[1] + by_shard[2][:1]
    mark(migration, sharded, short, ttl_ms=1_000)
    mark(migration, sharded, by_shard[0] + by_shard[2][1:], ttl_ms=DAY_MS)
    # A key of shard 0 whose Mark lost its 7 bytes, the flag kept (malformed), counted when set.
    bad = by_shard[0][0]
    shard0 = sharded.shards[0]
    bucket = shard0.bucket(bucket_index(bad, index.bucket_counts(sharded)[0]))
    index.client.hset(bucket, bad.to_bytes(8, "big", signed=True), raw(index, sharded, bad)[:-7])
    index.clock.advance(2)
    out = start(index, sharded, keys, sid="w1")  # s3_01 not offered
    assert (out.marks.expired, out.marks.malformed, out.marks.active) == (3, 1, 2)
    assert marks_per_shard(index, sharded) == [1, 0, 1]
    assert [marked(index, sharded, k) for k in keys] == [k not in short and k != bad for k in keys]


def test_threads_racing_starts_on_marked_keys_write_each_once_with_exact_counters(index, sharded, migration):
    keys = spread(5, 16)
    served(index, sharded, keys)
    assert mark(migration, sharded, keys).accepted == 48
    base = [index.usage([shard])[0] for shard in sharded.shards]

    def race(t):
        mine = keys[t * 6 :] + keys[: t * 6]
        return start(index, sharded, mine, sid=f"r{t}", more_candidates=[S3]).marks.routed

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(race, range(8))) == 48
    for was, now in zip(base, [index.usage([shard])[0] for shard in sharded.shards], strict=True):
        assert now.bytes - was.bytes == now.by_type["ST_S3"] == 16 * 200
    assert marks_per_shard(index, sharded) == [16, 16, 16]

    def close(t):
        session = index.session(sharded, f"r{t}")
        return finish(index, sharded, f"r{t}", [True] * len(session.entries)).marks.consumed if session else 0

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(close, range(8))) == 48
    assert marks_per_shard(index, sharded) == [0, 0, 0]
    assert all(len(storages(index, sharded, k)) == 2 for k in keys)
    group = index.group_usage(["gs"])[0]
    assert group.by_type == {"ST_NFS": 48 * 200, "ST_S3": 48 * 200}


def test_a_sharded_copy_to_the_target_clears_its_marks_in_every_shard(index, sharded, migration):
    keys = spread(6, 2)
    served(index, sharded, keys)
    mark(migration, sharded, keys)
    records = index.read(sharded, keys, MODE_RAW)
    sources = [(k, r.locations[0].location_id) for k, r in zip(keys, records, strict=True)]
    target = CopyTarget("s3_01", "ST_S3", pack_count=0, by_location=False)
    begun = migration.begin_copy(
        sharded, sources, target, SIZES, "c1", now_ms(index) + 60_000, covers=COVERS, spec_group_count=3
    )
    assert begun.outcomes == "1" * 6
    copied = [j % 2 == 0 for j in range(6)]
    done = migration.finish_copy(sharded, "c1", copied, SIZES, FULL)
    assert (done.marks.consumed, done.marks.active) == (3, 3)
    assert [marked(index, sharded, k) for k in keys] == [not ok for ok in copied]
    assert marks_per_shard(index, sharded) == in_shards([k for k, ok in zip(keys, copied, strict=True) if not ok])


def test_a_block_the_target_holds_is_not_marked_in_its_shard(index, sharded, migration):
    keys = spread(7, 1)
    served(index, sharded, keys)
    mark(migration, sharded, keys[:1])
    start(index, sharded, keys[:1], sid="w1", more_candidates=[S3])
    finish(index, sharded, "w1", [True])
    result = mark(migration, sharded, [keys[0], keys[1], keys[0], keys[2]])
    assert (result.outcomes, result.active) == ("c1c1", 2)


def test_an_instance_out_of_storage_indexes_marks_nothing_in_any_shard(index, sharded, migration):
    keys = spread(8, 1)
    served(index, sharded, keys)
    for shard in sharded.shards:
        index.client.hset(shard.key("m"), "storages", 255)
    with pytest.raises(QuotaExceededError):
        mark(migration, sharded, keys)
    assert marks_per_shard(index, sharded) == [0, 0, 0]
    assert not any(marked(index, sharded, k) for k in keys)


def test_a_shard_being_removed_refuses_the_mark_as_gone(index, sharded, migration):
    keys = spread(9, 1)
    served(index, sharded, keys)
    index.client.hset(sharded.shards[1].key("m"), "removing", 1)
    with pytest.raises(InstanceGoneError):
        mark(migration, sharded, keys)
    (removed,) = [k for k in keys if shard_of(k, SHARDS) == 1]
    assert marks_per_shard(index, sharded)[1] == 0 and not marked(index, sharded, removed)
