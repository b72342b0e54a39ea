"""Tiered Copy of an instance spread over three shards (group ``instance_shards`` 3), as the
real tier_copy ASL in moto: NFS blocks copied to S3, the bytes at the S3 URIs equal, the
counters exact per type and per storage in every shard and in the group; DELETE_SOURCE; a
quota refusal writing nothing in any shard; a dead execution's targets failed by the reaper
in every shard (docs/tiered-storage.md)."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from chalicelib.clock import ManualClock
from chalicelib.index import Status
from chalicelib.index.sharding import shard_of
from chalicelib.protocol.codes import MigrationMethod
from chalicelib.protocol.models import (
    BlockMask,
    FinishWriteCacheRequest,
    MigrateCacheRequest,
    StartWriteCacheRequest,
    StorageConfig,
)
from chalicelib.workflows import migrations

from .harness import wait_execution, wait_for
from .test_tier_copy import (
    BLOCK,
    _api,
    _broken_copy,
    _copy,
    _counts,
    _exported,
    _group,
    _locations,
    _s3_bytes,
    _setup_tiers,
    _write,
)

pytestmark = pytest.mark.slow

SHARDS = 3


@pytest.fixture
def workflow_clock():
    return ManualClock()


@pytest.fixture
def tiers(stack, request):
    """Instance t1 of group "tiers" in three shards: blocks land on nfs_01, a route copies them to s3_01."""
    retention = getattr(request, "param", "MIGRATION_RETENTION_KEEP_BOTH")
    _setup_tiers(stack, _group(retention).model_copy(update={"instance_shards": SHARDS}))
    rt = stack.runtime
    assert rt.contexts("t1").layout.shard_count == SHARDS
    return stack


def _keys(count):
    """Block keys spread over the three shards in turn (shard = (key >> 40) mod 3)."""
    return [(i % SHARDS << 40) + i + 1 for i in range(count)]


def _per_shard(rt):
    layout = rt.contexts("t1").layout
    return [_counts(rt.index.usage([shard])[0]) for shard in layout.shards]


def _blocks_in(keys, shard):
    return sum(1 for k in keys if shard_of(k, SHARDS) == shard)


def test_a_sharded_instances_blocks_are_copied_to_s3_with_exact_counters_in_every_shard(tiers):
    rt = tiers.runtime
    keys = _keys(100)  # two batches, each spanning the three shards
    data = _write(rt, keys)
    before = _per_shard(rt)
    done = _copy(tiers, keys)
    assert done["status"] == "SUCCEEDED"
    results = json.loads(done["output"])["results"]
    assert sum(r["served"] for r in results) == len(keys) and sum(r["failed"] for r in results) == 0
    assert all(locs == [("nfs_01", Status.SERVING), ("s3_01", Status.SERVING)] for locs in _locations(rt, keys))
    for key in keys[:3] + keys[-3:]:  # one of each shard at each end
        assert _s3_bytes(rt, key) == data[key]
    for s, (was, now) in enumerate(zip(before, _per_shard(rt), strict=True)):
        mine = _blocks_in(keys, s) * BLOCK
        assert (now["bytes"], now["keys"]) == (was["bytes"] + mine, was["keys"])
        assert now["by_type"] == {"ST_NFS": mine, "ST_S3": mine}
        assert now["by_storage"] == {"nfs_01": mine, "s3_01": mine}
        assert now["deleting_bytes"] == 0
    group = _counts(rt.index.group_usage(["tiers"])[0])
    assert (group["bytes"], group["keys"]) == (2 * len(keys) * BLOCK, len(keys))
    assert group["by_type"] == {"ST_NFS": len(keys) * BLOCK, "ST_S3": len(keys) * BLOCK}
    # Run again: every target is held already in its shard, nothing moves.
    again = json.loads(_copy(tiers, keys)["output"])["results"]
    assert sum(r["served"] for r in again) == 0
    assert _counts(rt.index.group_usage(["tiers"])[0]) == group


@pytest.mark.parametrize("tiers", ["MIGRATION_RETENTION_DELETE_SOURCE"], indirect=True)
def test_delete_source_leaves_only_the_s3_copies_in_every_shard(tiers):
    rt = tiers.runtime
    keys = _keys(9)
    data = _write(rt, keys)
    done = _copy(tiers, keys)
    assert done["status"] == "SUCCEEDED"
    (result,) = json.loads(done["output"])["results"]
    assert (result["served"], result["sources_deleted"]) == (len(keys), len(keys))
    assert wait_for(lambda: _locations(rt, keys) == [[("s3_01", Status.SERVING)]] * len(keys), 20)
    assert all(_s3_bytes(rt, key) == data[key] for key in keys)
    for s, usage in enumerate(_per_shard(rt)):
        mine = _blocks_in(keys, s) * BLOCK
        assert (usage["bytes"], usage["keys"], usage["deleting_bytes"]) == (mine, _blocks_in(keys, s), 0)
        assert usage["by_type"] == {"ST_S3": mine} and usage["by_storage"] == {"s3_01": mine}
    group = _counts(rt.index.group_usage(["tiers"])[0])
    assert (group["bytes"], group["keys"], group["by_type"]) == (len(keys) * BLOCK, len(keys), {"ST_S3": 9 * BLOCK})


def test_a_copy_refused_in_one_shard_writes_nothing_in_any(tiers):
    """ST_S3 has room for two blocks; shard 0's part alone adds three, so it refuses while
    the other shards' parts (one block each) fit: they are undone and the batch is refused."""
    rt = tiers.runtime
    keys = [1, 2, 3, 1 << 40, 2 << 40]
    _write(rt, keys)
    group = rt.control.get_group("tiers")
    group.quota.quota_config[0].capacity = 2 * BLOCK
    rt.control.update_group(group.model_copy(update={"version": 0}), group.version)
    rt.config.sync()
    before = _locations(rt, keys), _per_shard(rt), _counts(rt.index.group_usage(["tiers"])[0])
    done = _copy(tiers, keys)
    assert done["status"] == "SUCCEEDED"
    (result,) = json.loads(done["output"])["results"]
    assert result["refused"] == "QuotaExceededError", result
    assert (_locations(rt, keys), _per_shard(rt), _counts(rt.index.group_usage(["tiers"])[0])) == before


def test_a_dead_copys_targets_are_failed_by_the_reaper_in_every_shard(tiers, monkeypatch):
    rt = tiers.runtime
    keys = _keys(6)
    _write(rt, keys)
    before = _per_shard(rt)
    monkeypatch.setattr(migrations, "copy_blocks", _broken_copy)
    monkeypatch.setattr(migrations.CopyTasks, "finish", lambda self, event: _broken_copy())
    assert _copy(tiers, keys)["status"] == "FAILED"
    assert [locs[1] for locs in _locations(rt, keys)] == [("s3_01", Status.WRITING)] * len(keys)
    rt.clock.advance(migrations.COPY_SESSION_TTL_S - 1)
    assert rt.session_reaper.expire_write_sessions()["expired"] == 0, "a live copy's targets were failed"
    rt.clock.advance(2)
    assert rt.session_reaper.expire_write_sessions() == {"expired": 1, "blocks": len(keys)}
    assert all(status != Status.WRITING for locs in _locations(rt, keys) for _, status in locs)
    assert wait_for(lambda: _locations(rt, keys) == [[("nfs_01", Status.SERVING)]] * len(keys), 20)
    assert wait_for(lambda: _per_shard(rt) == before, 5)


def _event(execution, keys, retention="MIGRATION_RETENTION_KEEP_BOTH"):
    return {
        "instance_id": "t1",
        "source": "nfs_01",
        "target": "s3_01",
        "retention": retention,
        "execution": execution,
        "batch": 0,
        "block_keys": keys,
    }


@pytest.mark.parametrize("tiers", ["MIGRATION_RETENTION_DELETE_SOURCE"], indirect=True)
def test_every_step_run_again_does_the_same_on_a_sharded_instance(tiers):
    """A retried begin rebuilds the batch from the session's parts (in the batch's order), a
    retried finish whose session is gone reads the outcomes from every shard's records."""
    rt = tiers.runtime
    keys = _keys(6)
    data = _write(rt, keys)
    tasks = rt.copy_tasks
    event = _event("replayed", keys, "MIGRATION_RETENTION_DELETE_SOURCE")
    begun = tasks.begin(event)
    assert [b[0] for b in begun["blocks"]] == keys
    assert tasks.begin(event) == begun
    copied = tasks.copy(begun)
    first = tasks.finish(copied)
    assert (first["served"], first["sources_deleted"]) == (6, 6)
    again = tasks.finish(copied)
    assert (again["served"], again["failed"], again["sources_deleted"]) == (6, 0, 0)
    assert wait_for(lambda: _locations(rt, keys) == [[("s3_01", Status.SERVING)]] * len(keys), 20)
    assert all(_s3_bytes(rt, key) == data[key] for key in keys)


def test_racing_copies_of_the_same_blocks_make_one_target_each_in_every_shard(tiers):
    """Batches of several executions over the same blocks, their begins on threads at once."""
    rt = tiers.runtime
    keys = _keys(30)
    _write(rt, keys)
    before = _per_shard(rt)
    tasks = rt.copy_tasks
    events = [_event(f"race{t}", keys[t * 5 :] + keys[: t * 5]) for t in range(6)]
    with ThreadPoolExecutor(max_workers=len(events)) as pool:
        begun = list(pool.map(tasks.begin, events))
    assert sum(len(b["blocks"]) for b in begun) == len(keys)
    assert all(locs == [("nfs_01", Status.SERVING), ("s3_01", Status.WRITING)] for locs in _locations(rt, keys))
    with ThreadPoolExecutor(max_workers=len(events)) as pool:
        done = list(pool.map(lambda b: tasks.finish(tasks.copy(b)), begun))
    assert sum(d["served"] for d in done) == len(keys)
    assert all(locs == [("nfs_01", Status.SERVING), ("s3_01", Status.SERVING)] for locs in _locations(rt, keys))
    for s, (was, now) in enumerate(zip(before, _per_shard(rt), strict=True)):
        mine = _blocks_in(keys, s) * BLOCK
        assert now["by_type"] == {"ST_NFS": mine, "ST_S3": mine} and now["bytes"] == was["bytes"] + mine


def test_admin_migrate_cache_copies_a_sharded_instance(tiers):
    """No longer refused (UNSUPPORTED): admin COPY moves every shard's blocks and deletes the sources."""
    rt = tiers.runtime
    keys = _keys(6)
    data = _write(rt, keys)
    answer = rt.migration_admin.migrate_cache(
        MigrateCacheRequest(
            instance_id="t1",
            source_storage_name="nfs_01",
            target_storage_name="s3_01",
            block_keys=[*keys, 99],
            method=MigrationMethod.MIGRATION_METHOD_COPY,
        )
    )
    assert (answer.accepted, answer.rejected) == (6, 1)
    assert wait_execution(tiers.sfn, answer.execution_arn, timeout_s=60)["status"] == "SUCCEEDED"
    assert wait_for(lambda: _locations(rt, keys) == [[("s3_01", Status.SERVING)]] * len(keys), 20)
    assert all(_s3_bytes(rt, key) == data[key] for key in keys)


def _add_nfs_02(rt, root):
    """Storage nfs_02 (under ``root``) as the group's third candidate, after nfs_01 and s3_01."""
    root.mkdir()
    rt.control.add_storage(
        StorageConfig.model_validate({"global_unique_name": "nfs_02", "nfs": {"root_path": str(root)}})
    )
    group = rt.control.get_group("tiers")
    candidates = [*group.storage_candidates, "nfs_02"]
    rt.control.update_group(group.model_copy(update={"version": 0, "storage_candidates": candidates}), group.version)
    rt.config.sync()
    rt.contexts.forget("t1")


def _marks_active():
    return _exported("migration.marks")[
        ("migration.marks_active", (("instance_group", "tiers"), ("instance_id", "t1")))
    ]


def test_admin_migrate_cache_marks_a_sharded_instance_and_both_marks_what_the_copy_does_not_take(tiers, tmp_path):
    """MARK over HTTP marks blocks in every shard (the gauge is the instance's Marks, summed
    over the shards); their next startWriteCache answers S3 URIs for them and NFS ones for
    the others; the finish consumes them. BOTH on a sharded instance: the blocks on the
    source go to the Copy, those SERVING elsewhere (here nfs_02) are marked."""
    rt = tiers.runtime
    _add_nfs_02(rt, tmp_path / "nfs_02")
    keys = _keys(6)
    _write(rt, keys)
    mark = {"instance_id": "t1", "source_storage_name": "nfs_01", "target_storage_name": "s3_01"}
    answer = _api("migrateCache", {**mark, "method": "MIGRATION_METHOD_MARK", "block_keys": [*keys, 99]})
    assert answer["header"]["status"]["code"] == "OK", answer
    assert (answer["accepted"], answer["rejected"], answer.get("execution_arn", "")) == ("6", "1", "")
    assert _marks_active() == 6
    layout = rt.contexts("t1").layout
    assert [int(rt.index.client.hget(shard.key("u"), "mk")) for shard in layout.shards] == [2, 2, 2]

    fresh = _keys(9)[6:]
    start = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="t1", block_keys=keys + fresh))
    assert start.block_mask == BlockMask(offset=0), start.block_mask
    uris = [loc["location_specs"][0]["uri"] for loc in start.locations]
    assert all(u.startswith("s3://s3_01/") for u in uris[:6]) and all(u.startswith("file://nfs_01/") for u in uris[6:])
    rt.cache.finish_write_cache(
        FinishWriteCacheRequest(
            instance_id="t1", write_session_id=start.write_session_id, success_blocks=BlockMask(offset=9)
        )
    )
    assert _locations(rt, keys) == [[("nfs_01", Status.SERVING), ("s3_01", Status.SERVING)]] * 6
    exported = _exported("migration.marks")
    assert exported[("migration.marks_consumed_total", (("instance_group", "tiers"),))] == 6
    assert _marks_active() == 0

    # Blocks on nfs_02 only (an admin Copy moved them there), then BOTH over them and blocks on nfs_01.
    elsewhere, on_source = _keys(15)[9:], _keys(18)[15:]
    _write(rt, elsewhere)
    _write(rt, on_source)
    moved = rt.migration_admin.migrate_cache(
        MigrateCacheRequest(
            instance_id="t1",
            source_storage_name="nfs_01",
            target_storage_name="nfs_02",
            block_keys=elsewhere,
            method=MigrationMethod.MIGRATION_METHOD_COPY,
        )
    )
    assert wait_execution(tiers.sfn, moved.execution_arn, timeout_s=60)["status"] == "SUCCEEDED"
    assert wait_for(lambda: _locations(rt, elsewhere) == [[("nfs_02", Status.SERVING)]] * 6, 20)
    both = _api("migrateCache", {**mark, "method": "MIGRATION_METHOD_BOTH", "block_keys": [*on_source, *elsewhere, 99]})
    assert (both["accepted"], both["rejected"]) == ("9", "1") and both["execution_arn"]
    assert _marks_active() == 6
    assert wait_execution(tiers.sfn, both["execution_arn"], timeout_s=60)["status"] == "SUCCEEDED"
    assert wait_for(lambda: _locations(rt, on_source) == [[("s3_01", Status.SERVING)]] * 3, 20)
    start = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="t1", block_keys=elsewhere))
    assert all(loc["location_specs"][0]["uri"].startswith("s3://s3_01/") for loc in start.locations)
    assert len(start.locations) == 6
