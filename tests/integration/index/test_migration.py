"""The index side of a tiered Copy (chalicelib/index/migration.py) on a real Valkey: the
WRITING target and its usage in one step, the source re-checked before the target serves,
orphans failed by expiry, and exact counters under threads."""

import os
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest

from chalicelib.index import Status
from chalicelib.index.errors import QuotaExceededError, WriteSessionError
from chalicelib.index.migration import CopyQuotas, CopyTarget, MigrationIndex
from chalicelib.index.types import MODE_PREFIX, MODE_RAW
from chalicelib.protocol.models import StorageConfig
from chalicelib.storage import BlockRef, FileBackend, S3Backend, SpecSlot, StorageBackend, copy_blocks

from .test_block_index import SIZES, finish, start

S3 = CopyTarget("s3_01", "ST_S3", pack_count=0, by_location=False)
NFS2 = CopyTarget("nfs_02", "ST_NFS", pack_count=4, by_location=True)


@pytest.fixture
def migration(index):
    return MigrationIndex(index)


def write(index, layout, keys):
    """Blocks written and SERVING on nfs_01 (test_block_index's start); their (key, location id)."""
    start(index, layout, keys, sid="w1")
    finish(index, layout, "w1", [True] * len(keys))
    stored = records(index, layout, keys)
    return [(key, record.locations[0].location_id) for key, record in zip(keys, stored, strict=True)]


def records(index, layout, keys):
    return index.read(layout, keys, MODE_RAW)


def begin(migration, index, layout, sources, target=S3, sid="c1", **kw):
    deadline = int(index.clock.now() * 1000) + kw.pop("ttl_ms", 60_000)
    return migration.begin_copy(layout, sources, target, SIZES, sid, deadline, **kw)


def test_begin_adds_a_writing_target_with_its_usage_and_finish_serves_it(index, migration):
    layout = index.layout("inst", 4, group="g1")
    sources = write(index, layout, [1, 2, 3])
    before = index.usage([layout])[0]
    begun = begin(migration, index, layout, sources)
    assert begun.outcomes == "111" and begun.bytes_added == 600
    assert [(p[0], p[1]) for p in begun.placements] == sources
    for record, placement in zip(records(index, layout, [1, 2, 3]), begun.placements, strict=True):
        source, target = record.locations
        assert (source.status, target.status) == (Status.SERVING, Status.WRITING)
        assert target.storage_index == begun.target_storage_index != source.storage_index
        assert (target.location_id, target.group_id, target.slot) == placement[2:]
    usage = index.usage([layout])[0]
    assert (usage.bytes, usage.keys) == (before.bytes + 600, before.keys)
    assert usage.by_type == {"ST_NFS": 600, "ST_S3": 600} and usage.by_storage["s3_01"] == 600
    group = index.group_usage(["g1"])[0]
    assert (group.bytes, group.keys, group.by_type) == (1200, 3, {"ST_NFS": 600, "ST_S3": 600})
    # WRITING targets are never served; the source still is.
    assert [r.locations[0].status for r in index.read(layout, [1, 2, 3], MODE_PREFIX)] == [Status.SERVING] * 3

    finished = migration.finish_copy(layout, "c1", [True, True, True], SIZES)
    assert finished.served == (0, 1, 2) and finished.failed == () and finished.victims == ()
    assert {loc.status for r in records(index, layout, [1, 2, 3]) for loc in r.locations} == {Status.SERVING}
    assert index.usage([layout])[0].bytes == before.bytes + 600
    with pytest.raises(WriteSessionError):
        migration.finish_copy(layout, "c1", [True, True, True], SIZES)


def test_a_target_whose_source_stopped_serving_meanwhile_fails(index, layout, migration):
    sources = write(index, layout, [1, 2, 3])
    begin(migration, index, layout, sources)
    (key, location) = sources[1]
    index.mark_deleting(layout, [key], SIZES, expected_locations=[location])
    finished = migration.finish_copy(layout, "c1", [True, True, True], SIZES)
    assert finished.served == (0, 2) and finished.failed == (1,)
    assert [v.block_key for v in finished.victims] == [2]
    assert records(index, layout, [2])[0].locations[1].status == Status.DELETING


def test_a_block_reported_not_copied_fails_and_is_handed_to_deletion(index, layout, migration):
    sources = write(index, layout, [1, 2])
    begin(migration, index, layout, sources, target=NFS2)
    finished = migration.finish_copy(layout, "c1", [True, False], SIZES)
    assert finished.served == (0,) and finished.failed == (1,)
    usage = index.usage([layout])[0]
    assert usage.deleting_bytes == 200 and usage.deleting_by_type == {"ST_NFS": 200}


def test_sources_not_serving_and_targets_already_held_are_skipped(index, layout, migration):
    sources = write(index, layout, [1, 2, 3])
    begin(migration, index, layout, sources[:1], sid="c0")
    wrong_id = (sources[1][0], sources[1][1] + 1000)
    begun = begin(migration, index, layout, [sources[0], wrong_id, (99, 1), sources[2], sources[2]])
    assert begun.outcomes == "cgg1c" and begun.bytes_added == 200
    assert [(p[0], p[1]) for p in begun.placements] == [sources[2]]
    session = index.session(layout, "c1")
    assert [key for key, _ in session.entries] == [3]


def test_a_by_location_target_takes_a_block_whose_copy_there_is_deleting(index, layout, migration):
    sources = write(index, layout, [1])
    begin(migration, index, layout, sources, target=NFS2, sid="c0")
    migration.finish_copy(layout, "c0", [False], SIZES)  # the first copy is DELETING
    assert begin(migration, index, layout, sources, target=NFS2).outcomes == "1"
    assert begin(migration, index, layout, sources, target=NFS2, sid="c2").outcomes == "c"


@pytest.mark.parametrize(
    ("quotas", "target", "kind"),
    [
        (CopyQuotas(group_capacity=1000), S3, "GROUP"),
        (CopyQuotas(instance_capacity=700), S3, "INSTANCE"),
        (CopyQuotas(), CopyTarget("s3_01", "ST_S3", 0, False, type_capacity=300), "TYPE"),
    ],
)
def test_a_copy_over_a_quota_is_refused_and_writes_nothing(index, layout, migration, quotas, target, kind):
    sources = write(index, layout, [1, 2, 3])
    before_records = records(index, layout, [1, 2, 3])
    before_usage = index.usage([layout])[0]
    with pytest.raises(QuotaExceededError) as refused:
        begin(migration, index, layout, sources, target=target, quotas=quotas)
    assert refused.value.kind.name == kind
    assert records(index, layout, [1, 2, 3]) == before_records
    assert index.usage([layout])[0] == before_usage
    assert index.session(layout, "c1") is None


def test_an_orphan_copy_is_failed_by_the_reaper_and_a_late_finish_is_refused(index, layout, migration):
    """A Copy whose caller died: the reaper finds its session due and fails it as it fails
    every write session (CacheService.fail_session), so no target stays WRITING."""
    sources = write(index, layout, [1, 2])
    begin(migration, index, layout, sources, target=NFS2, ttl_ms=5_000)
    index.clock.advance(6)
    now_ms = int(index.clock.now() * 1000)
    assert "inst" in index.instances_due(now_ms)
    assert index.due_sessions(["inst"], now_ms) == {"inst": ["c1"]}
    failed = index.finish(layout, "c1", index.session(layout, "c1"), (), SIZES, force_fail=True)
    assert [v.block_key for v in failed.victims] == [1, 2]
    assert {r.locations[1].status for r in records(index, layout, [1, 2])} == {Status.DELETING}
    assert {r.locations[0].status for r in records(index, layout, [1, 2])} == {Status.SERVING}
    with pytest.raises(WriteSessionError):
        migration.finish_copy(layout, "c1", [True, True], SIZES)


def test_a_copy_finished_after_its_deadline_serves_nothing(index, layout, migration):
    sources = write(index, layout, [1, 2])
    begin(migration, index, layout, sources, target=NFS2, ttl_ms=5_000)
    index.clock.advance(6)
    finished = migration.finish_copy(layout, "c1", [True, True], SIZES)
    assert finished.served == () and finished.failed == (0, 1)
    assert {r.locations[1].status for r in records(index, layout, [1, 2])} == {Status.DELETING}


def test_racing_copies_of_the_same_blocks_make_one_target_each_and_exact_usage(index, layout, migration):
    keys = list(range(1, 65))
    sources = write(index, layout, keys)
    base = index.usage([layout])[0]
    threads = 8

    def copy(t):
        # Every thread asks for every block, from a different starting point.
        mine = sources[t * 8 :] + sources[: t * 8]
        return begin(migration, index, layout, mine, sid=f"c{t}")

    with ThreadPoolExecutor(max_workers=threads) as pool:
        begun = list(pool.map(copy, range(threads)))
    assert sum(b.outcomes.count("1") for b in begun) == len(keys)
    assert sum(b.bytes_added for b in begun) == 200 * len(keys)
    targets = [r.locations[1:] for r in records(index, layout, keys)]
    assert all(len(t) == 1 and t[0].status == Status.WRITING for t in targets)
    assert len({t[0].location_id for t in targets}) == len(keys)
    usage = index.usage([layout])[0]
    assert usage.bytes == base.bytes + 200 * len(keys) and usage.by_type["ST_S3"] == 200 * len(keys)

    def close(t):
        taken = begun[t].outcomes.count("1")
        return migration.finish_copy(layout, f"c{t}", [j % 2 == 0 for j in range(taken)], SIZES) if taken else None

    with ThreadPoolExecutor(max_workers=threads) as pool:
        finished = [f for f in pool.map(close, range(threads)) if f is not None]
    failed = sum(len(f.failed) for f in finished)
    statuses = [r.locations[1].status for r in records(index, layout, keys)]
    assert statuses.count(Status.DELETING) == failed and statuses.count(Status.SERVING) == len(keys) - failed
    usage = index.usage([layout])[0]
    assert usage.bytes == base.bytes + 200 * len(keys)
    assert usage.deleting_bytes == 200 * failed and usage.deleting_by_type == {"ST_S3": 200 * failed}


@pytest.mark.parametrize("target_kind", ["s3", "nfs"])
def test_a_copy_through_index_and_storage_leaves_the_target_bytes_equal_to_the_source(
    index, layout, migration, tmp_path, aws, target_kind
):
    """begin_copy's placements are where copy_blocks writes: once finish_copy serves the
    target, the bytes at its URIs are the source's (a hot NFS tier over S3 or NFS)."""
    specs = (SpecSlot("tp0", 0, 100), SpecSlot("tp1", 100, 100))  # spec group 0: 200 bytes
    hot = _nfs(tmp_path / "hot", "nfs_01", 8)
    if target_kind == "s3":
        boto3.client("s3").create_bucket(Bucket="cold")
        cold: StorageBackend = S3Backend(
            StorageConfig.model_validate({"global_unique_name": "s3_01", "s3": {"bucket": "cold"}}),
            lambda: boto3.client("s3"),
        )
        target = S3
    else:
        cold, target = _nfs(tmp_path / "cold", "nfs_02", 4), NFS2
    keys = list(range(1, 11))
    sources = write(index, layout, keys)
    hot_blocks = [
        BlockRef("inst", key, loc.location_id, loc.group_id, loc.slot, specs)
        for key, loc in ((k, r.locations[0]) for k, r in zip(keys, records(index, layout, keys), strict=True))
    ]
    hot.write(hot_blocks, [[os.urandom(s.size) for s in specs] for _ in hot_blocks])  # what the engine wrote
    begun = begin(migration, index, layout, sources, target=target)
    cold_blocks = [BlockRef("inst", key, loc, group, slot, specs) for key, _, loc, group, slot in begun.placements]
    copy_blocks(hot, hot_blocks, cold, cold_blocks, concurrency=2, batch_blocks=3)
    assert migration.finish_copy(layout, "c1", [True] * len(keys), SIZES).served == tuple(range(len(keys)))
    assert cold.read(cold_blocks) == hot.read(hot_blocks)
    served = [r.locations[1] for r in records(index, layout, keys)]
    assert [(loc.status, loc.group_id, loc.slot) for loc in served] == [
        (Status.SERVING, b.group_id, b.slot) for b in cold_blocks
    ]


def _nfs(root, name, pack):
    root.mkdir()
    config = {"global_unique_name": name, "nfs": {"root_path": str(root), "key_count_per_file": pack}}
    return FileBackend(StorageConfig.model_validate(config), min_free_bytes=0)


def _demoting(index, layout):
    return index.usage([layout])[0].demoting_by_type


@pytest.mark.parametrize("closed", ["served", "not copied", "expired"])
def test_a_demotes_bytes_count_from_its_begin_until_its_session_closes_whatever_closes_it(
    index, layout, migration, closed
):
    """A reclaim's demote (``demoted_type``): the bytes begin takes are the instance's
    ``mt:<type>`` in the same step, and the step closing the session gives them back."""
    sources = write(index, layout, [1, 2, 3])
    begin(migration, index, layout, sources[:1], sid="c0")  # 1 is held on S3 already: not taken
    begun = begin(migration, index, layout, sources, demoted_type="ST_NFS", ttl_ms=5_000)
    assert begun.outcomes == "c11" and _demoting(index, layout) == {"ST_NFS": 400}
    assert index.usage([layout])[0].reclaimable().by_type == {"ST_NFS": 200, "ST_S3": 600}
    if closed == "expired":
        index.clock.advance(6)
        index.finish(layout, "c1", index.session(layout, "c1"), (), SIZES, force_fail=True)
    else:
        migration.finish_copy(layout, "c1", [closed == "served"] * 2, SIZES)
    assert _demoting(index, layout) == {}
    # A plain Copy counts nothing.
    migration.finish_copy(layout, "c0", [True], SIZES)
    assert _demoting(index, layout) == {}


def test_a_refused_demote_counts_nothing(index, layout, migration):
    sources = write(index, layout, [1, 2])
    with pytest.raises(QuotaExceededError):
        begin(
            migration,
            index,
            layout,
            sources,
            target=CopyTarget("s3_01", "ST_S3", 0, False, type_capacity=300),
            demoted_type="ST_NFS",
        )
    assert _demoting(index, layout) == {}
