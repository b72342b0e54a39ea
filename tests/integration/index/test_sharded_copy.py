"""The index side of a tiered Copy on an instance spread over three shards of a three-master
cluster (chalicelib/index/migration.py, docs/tiered-storage.md): one step per shard, the
counters exact in each shard and the group, a refusal in one shard leaving nothing in any,
the parts failed at expiry in every shard, racing copies making one target each."""

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from chalicelib.index import BlockIndex, Status
from chalicelib.index.errors import QuotaExceededError
from chalicelib.index.migration import CopyQuotas, CopyTarget, MigrationIndex
from chalicelib.index.sharding import shard_of
from chalicelib.index.types import MODE_RAW

from .test_sharded_instance import SIZE, keys_of, write

S3 = CopyTarget("s3_01", "ST_S3", pack_count=0, by_location=False)
NFS2 = CopyTarget("nfs_02", "ST_NFS", pack_count=4, by_location=True)


@pytest.fixture
def index(cluster3, clock):
    return BlockIndex(cluster3, "kvcm", clock)


@pytest.fixture
def sharded(index):
    return index.claim("sh", "inc-1", 4, registering=True, shard_count=3, group="gs")


@pytest.fixture
def migration(index):
    return MigrationIndex(index)


def served(index, layout, keys):
    """Blocks SERVING on "nfs" in every shard; their (key, location id)."""
    write(index, layout, keys, "w1")
    return [(k, r.locations[0].location_id) for k, r in zip(keys, index.read(layout, keys, MODE_RAW), strict=True)]


def begin(migration, index, layout, sources, target=S3, sid="c1", ttl_ms=60_000, **kw):
    deadline = int(index.clock.now() * 1000) + ttl_ms
    return migration.begin_copy(layout, sources, target, [SIZE], sid, deadline, **kw)


def per_shard(index, layout):
    return [index.usage([shard])[0] for shard in layout.shards]


def test_a_copy_takes_each_shards_blocks_in_one_step_there_and_finishes_in_the_calls_order(index, sharded, migration):
    rng = random.Random(1)
    keys = keys_of(rng, 4, shard=0) + keys_of(rng, 3, shard=1) + keys_of(rng, 2, shard=2)
    rng.shuffle(keys)
    sources = served(index, sharded, keys)
    before = per_shard(index, sharded)
    begun = begin(migration, index, sharded, sources)
    assert begun.outcomes == "1" * 9 and begun.bytes_added == 9 * SIZE
    assert [p[:2] for p in begun.placements] == sources
    # Each shard's counters moved by its own blocks' bytes, in that shard's step.
    for s, (was, now) in enumerate(zip(before, per_shard(index, sharded), strict=True)):
        mine = sum(1 for k in keys if shard_of(k, 3) == s) * SIZE
        assert (now.bytes - was.bytes, now.keys - was.keys) == (mine, 0)
        assert now.by_type.get("ST_S3", 0) == mine and now.by_storage.get("s3_01", 0) == mine
    group = index.group_usage(["gs"])[0]
    assert (group.bytes, group.keys, group.by_type) == (18 * SIZE, 9, {"ST_NFS": 9 * SIZE, "ST_S3": 9 * SIZE})
    # One storage index for the target in every shard; the targets' ids unique per instance.
    records = index.read(sharded, keys, MODE_RAW)
    assert {r.locations[1].storage_index for r in records} == {begun.target_storage_index}
    assert [(r.locations[1].location_id, r.locations[1].status) for r in records] == [
        (p[2], Status.WRITING) for p in begun.placements
    ]
    # The parts read back as one session, in the call's order (what a retried begin rebuilds from).
    session = index.session(sharded, "c1")
    assert len(session.parts) == 3 and [e for e in session.entries] == [(p[0], p[2]) for p in begun.placements]
    mask = [j % 3 != 1 for j in range(9)]
    finished = migration.finish_copy(sharded, "c1", mask, [SIZE])
    assert finished.failed == tuple(j for j in range(9) if not mask[j])
    assert sorted(v.block_key for v in finished.victims) == sorted(keys[j] for j in finished.failed)
    statuses = [r.locations[1].status for r in index.read(sharded, keys, MODE_RAW)]
    assert statuses == [Status.SERVING if ok else Status.DELETING for ok in mask]
    usage = index.usage([sharded])[0]
    assert usage.deleting_by_type == {"ST_S3": 3 * SIZE} and index.session(sharded, "c1") is None
    assert index.due_sessions(["sh"], 2**48) == {}


def test_the_instance_quota_is_split_per_shard_and_a_refusal_in_one_shard_writes_nothing_in_any(
    index, sharded, migration
):
    """As a sharded start: each shard holds its share of the instance's byte quota (here 4
    blocks each). A Copy that would pass one shard's share is refused whole, even while the
    instance as a whole has room; the parts the other shards made are failed and dropped."""
    rng = random.Random(2)
    full = keys_of(rng, 3, shard=1)
    others = keys_of(rng, 1, shard=0) + keys_of(rng, 1, shard=2)
    sources = served(index, sharded, full + others)  # 5 blocks: 200 × 5 bytes of 12 × 200
    quotas = CopyQuotas(instance_capacity=12 * SIZE)
    before = [u.fields() for u in per_shard(index, sharded)], index.group_usage(["gs"])[0].fields()
    records = index.read(sharded, full + others, MODE_RAW)
    with pytest.raises(QuotaExceededError) as refused:
        begin(migration, index, sharded, sources, quotas=quotas)  # shard 1: 3 + 3 blocks > 4
    assert (refused.value.kind.name, refused.value.shortfall) == ("INSTANCE", 2 * SIZE)
    assert index.read(sharded, full + others, MODE_RAW) == records
    assert ([u.fields() for u in per_shard(index, sharded)], index.group_usage(["gs"])[0].fields()) == before
    assert index.session(sharded, "c1") is None and index.due_sessions(["sh"], 2**48) == {}
    # Within every share it passes: shard 1 takes one more block (3 + 1 = 4), the others theirs.
    begun = begin(migration, index, sharded, sources[2:], sid="c2", quotas=quotas)
    assert begun.outcomes == "111"
    assert index.usage([sharded])[0].bytes == 8 * SIZE == index.group_usage(["gs"])[0].bytes


@pytest.mark.parametrize(
    ("quotas", "target", "kind"),
    [
        (CopyQuotas(group_capacity=7 * SIZE), S3, "GROUP"),
        (CopyQuotas(), CopyTarget("s3_01", "ST_S3", 0, False, type_capacity=2 * SIZE), "TYPE"),
    ],
)
def test_group_and_type_quotas_count_the_summed_group_in_every_shard(index, sharded, migration, quotas, target, kind):
    """The group's and the target type's quotas use the group's summed counters (read before
    the call; each shard counts its own part from its counters), as sharded starts do: room
    for 2 more blocks, and shard 0 alone adds 3, so it refuses while the others grant, and
    their parts are undone."""
    rng = random.Random(3)
    sources = served(index, sharded, keys_of(rng, 3, shard=0) + keys_of(rng, 1, shard=1) + keys_of(rng, 1, shard=2))
    group = index.group_usage(["gs"])[0].live()
    before = [u.fields() for u in per_shard(index, sharded)], index.group_usage(["gs"])[0].fields()
    with pytest.raises(QuotaExceededError) as refused:
        begin(migration, index, sharded, sources, target=target, quotas=replace(quotas, group_usage=group))
    assert (refused.value.kind.name, refused.value.shortfall) == (kind, SIZE)
    assert ([u.fields() for u in per_shard(index, sharded)], index.group_usage(["gs"])[0].fields()) == before
    assert index.session(sharded, "c1") is None


def test_an_expired_copy_is_due_and_failed_in_every_shard(index, sharded, migration):
    keys = keys_of(random.Random(4), 9)
    sources = served(index, sharded, keys)
    begin(migration, index, sharded, sources, target=NFS2, ttl_ms=5_000)
    now_ms = int(index.clock.now() * 1000)
    assert index.due_sessions(["sh"], now_ms + 4_000) == {}
    index.clock.advance(6)
    assert "sh" in index.instances_due(now_ms + 6_000)
    assert index.due_sessions(["sh"], now_ms + 6_000) == {"sh": ["c1"]}
    # What the reaper does (CacheService.fail_session).
    failed = index.finish(sharded, "c1", index.session(sharded, "c1"), (), [SIZE], force_fail=True)
    assert sorted(v.block_key for v in failed.victims) == sorted(keys)
    assert {r.locations[1].status for r in index.read(sharded, keys, MODE_RAW)} == {Status.DELETING}
    assert index.due_sessions(["sh"], 2**48) == {}


def test_racing_copies_of_the_same_blocks_make_one_target_each_in_every_shard(index, sharded, migration):
    keys = keys_of(random.Random(5), 48)
    sources = served(index, sharded, keys)
    base = per_shard(index, sharded)
    threads = 8

    def copy(t):
        mine = sources[t * 6 :] + sources[: t * 6]
        return begin(migration, index, sharded, mine, sid=f"c{t}")

    with ThreadPoolExecutor(max_workers=threads) as pool:
        begun = list(pool.map(copy, range(threads)))
    assert sum(b.outcomes.count("1") for b in begun) == len(keys)
    targets = [r.locations[1:] for r in index.read(sharded, keys, MODE_RAW)]
    assert all(len(t) == 1 and t[0].status == Status.WRITING for t in targets)
    assert len({t[0].location_id for t in targets}) == len(keys)
    for s, (was, now) in enumerate(zip(base, per_shard(index, sharded), strict=True)):
        assert now.bytes - was.bytes == sum(1 for k in keys if shard_of(k, 3) == s) * SIZE

    def close(t):
        taken = begun[t].outcomes.count("1")
        return migration.finish_copy(sharded, f"c{t}", [j % 2 == 0 for j in range(taken)], [SIZE]) if taken else None

    with ThreadPoolExecutor(max_workers=threads) as pool:
        finished = [f for f in pool.map(close, range(threads)) if f is not None]
    failed = sum(len(f.failed) for f in finished)
    statuses = [r.locations[1].status for r in index.read(sharded, keys, MODE_RAW)]
    assert statuses.count(Status.DELETING) == failed and statuses.count(Status.SERVING) == len(keys) - failed
    usage = index.usage([sharded])[0]
    assert usage.bytes == sum(u.bytes for u in base) + SIZE * len(keys)
    assert usage.deleting_by_type == {"ST_S3": SIZE * failed}
    group = index.group_usage(["gs"])[0]
    assert (group.bytes, group.by_type["ST_S3"], group.deleting_bytes) == (
        2 * SIZE * len(keys),
        SIZE * len(keys),
        SIZE * failed,
    )


def test_a_part_that_expired_fails_alone_while_the_others_serve(index, sharded, migration, cluster3):
    """A finish racing the deadline: one shard's part is past it when its script runs, the
    others are not. Only that part's targets fail; the rest serve and are reported served."""
    rng = random.Random(6)
    keys = keys_of(rng, 2, shard=0) + keys_of(rng, 2, shard=1) + keys_of(rng, 2, shard=2)
    rng.shuffle(keys)
    begin(migration, index, sharded, served(index, sharded, keys))
    cluster3.hset(sharded.shards[2].session("c1"), "d", int(index.clock.now() * 1000) - 1)
    finished = migration.finish_copy(sharded, "c1", [True] * 6, [SIZE])
    late = tuple(j for j, k in enumerate(keys) if shard_of(k, 3) == 2)
    assert finished.failed == late and finished.served == tuple(j for j in range(6) if j not in late)
    statuses = [r.locations[1].status for r in index.read(sharded, keys, MODE_RAW)]
    assert statuses == [Status.DELETING if j in late else Status.SERVING for j in range(6)]


def test_a_demote_counts_each_shards_part_there_and_every_close_gives_it_back(index, sharded, migration):
    rng = random.Random(7)
    keys = keys_of(rng, 2, shard=0) + keys_of(rng, 1, shard=1) + keys_of(rng, 3, shard=2)
    sources = served(index, sharded, keys)
    begin(migration, index, sharded, sources, demoted_type="ST_NFS")
    assert [u.demoting_by_type for u in per_shard(index, sharded)] == [{"ST_NFS": n * SIZE} for n in (2, 1, 3)]
    assert index.usage([sharded])[0].demoting_by_type == {"ST_NFS": 6 * SIZE}
    migration.finish_copy(sharded, "c1", [True] * 6, [SIZE])
    assert [u.demoting_by_type for u in per_shard(index, sharded)] == [{}, {}, {}]
    # A refusal in one shard (its share of the instance quota, 6 blocks: shard 1 would hold
    # 10, shard 0 takes its one within 6): shard 0's part, failed and dropped, gives its back.
    more = served(index, sharded, keys_of(rng, 1, shard=0) + keys_of(rng, 4, shard=1))
    with pytest.raises(QuotaExceededError) as refused:
        begin(migration, index, sharded, more, sid="c2", quotas=CopyQuotas(instance_capacity=18 * SIZE))
    assert refused.value.shortfall == 4 * SIZE
    assert [u.demoting_by_type for u in per_shard(index, sharded)] == [{}, {}, {}]
