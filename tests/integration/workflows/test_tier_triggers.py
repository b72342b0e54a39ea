"""Tier triggers (issue 24, item 4): a reclaim round whose group's source type is at a copy
strategy's trigger_threshold submits the coldest blocks on the source to the real tier_copy
ASL in moto (real Valkey, moto S3, NFS files); reclaim goes first when its own watermark is
passed too. The injected clock orders the blocks' recency."""

import json

import pytest

from chalicelib.capacity import SamplingConfig
from chalicelib.capacity import reclaimer as reclaimer_module
from chalicelib.clock import ManualClock
from chalicelib.index import Status
from chalicelib.index.types import MODE_PREFIX
from chalicelib.protocol.codes import MigrationRetention
from chalicelib.protocol.models import (
    DEFAULT_TRIGGER_PERIOD_S,
    InstanceGroup,
)

from .harness import wait_execution
from .test_tier_copy import BATCH, BLOCK, _api, _locations, _s3_bytes, _served_storages, _setup_tiers, _write

pytestmark = pytest.mark.slow  # every test waits for a state machine run on the wall clock

#: The NFS type's quota in blocks: the trigger compares the type's usage with it.
NFS_BLOCKS = 10


@pytest.fixture
def workflow_clock():
    return ManualClock()


def _group(
    threshold: float,
    used_percentage: float = 0.9,
    capacity: int = 1 << 30,
    s3_blocks: int = 0,
    demote_on_reclaim: bool = False,
) -> InstanceGroup:
    """NFS's type quota NFS_BLOCKS blocks (S3's ``s3_blocks``), a step of 100 %, one strategy
    nfs_01 -> s3_01: KEEP_BOTH, or with ``demote_on_reclaim`` DELETE_SOURCE and demoting."""
    strategy = {
        "source_storage_name": "nfs_01",
        "target_storage_name": "s3_01",
        "trigger_threshold": threshold,
        "method_configs": {"copy": {"enabled": True}},
        "retention": "MIGRATION_RETENTION_KEEP_BOTH",
    }
    if demote_on_reclaim:
        strategy |= {"retention": "MIGRATION_RETENTION_DELETE_SOURCE", "demote_on_reclaim": True}
    types = [{"storage_type": "ST_NFS", "capacity": NFS_BLOCKS * BLOCK}]
    if s3_blocks:
        types.append({"storage_type": "ST_S3", "capacity": s3_blocks * BLOCK})
    return InstanceGroup.model_validate(
        {
            "name": "tiers",
            "storage_candidates": ["nfs_01", "s3_01"],
            "quota": {"capacity": capacity, "quota_config": types},
            "cache_config": {
                "reclaim_strategy": {
                    "trigger_strategy": {"used_percentage": used_percentage},
                    "reclaim_step_percentage": 100,
                },
                "migration_config": {"strategies": [strategy], "copy_max_concurrency": 2},
            },
        }
    )


def _write_aged(stack, keys):
    """Each key written (as its own one-block prefix) one second after the previous: the
    first key is the coldest. Returns the bytes per key."""
    rt, data = stack.runtime, {}
    for key in keys:
        data.update(_write(rt, [key]))
        rt.clock.advance(2)
    return data


def _round(stack):
    """One reclaim round; waits for the Copies it started. Returns its group report."""
    rt = stack.runtime
    report = rt.reclaim_job.reclaimer.run_round()
    (group,) = [g for g in report.groups if g.group == "tiers"]
    assert not group.error, group.error
    for copy in group.copies:
        done = wait_execution(stack.sfn, copy.execution_arn, timeout_s=60)
        assert done["status"] == "SUCCEEDED", done
    return group


def _on(rt, keys, storage):
    return [k for k, locs in zip(keys, _locations(rt, keys), strict=True) if (storage, Status.SERVING) in locs]


def test_a_type_at_the_trigger_threshold_copies_its_coldest_blocks(stack, monkeypatch):
    _setup_tiers(stack, _group(threshold=0.5))
    rt = stack.runtime
    monkeypatch.setattr(reclaimer_module, "TRIGGER_BLOCKS_PER_ROUND", 2)
    keys = [101, 102, 103, 104, 105]
    data = _write_aged(stack, keys)
    # 5 of 10 blocks' worth: 0.5 ≥ 0.5 (under reclaim's 0.9). Read the two oldest: now warm.
    ctx = rt.contexts("t1")
    rt.index.read(ctx.layout, [101], MODE_PREFIX)
    rt.index.read(ctx.layout, [102], MODE_PREFIX)
    group = _round(stack)
    assert [(c.instance_id, c.source, c.target, c.blocks) for c in group.copies] == [("t1", "nfs_01", "s3_01", 2)]
    assert group.victims == 0
    assert _on(rt, keys, "s3_01") == [103, 104]
    assert _on(rt, keys, "nfs_01") == keys  # KEEP_BOTH
    assert _s3_bytes(rt, 103) == data[103]
    # The next look (the group's trigger period later) takes the next coldest, never a
    # block the target holds already.
    rt.clock.advance(DEFAULT_TRIGGER_PERIOD_S)
    group = _round(stack)
    assert [c.blocks for c in group.copies] == [2]
    # 105 (written last, never read) and 101 (read at the same second as 102: the key breaks the tie)
    assert _on(rt, keys, "s3_01") == [101, 103, 104, 105]
    usage = rt.index.usage([ctx.layout])[0]
    assert usage.by_type == {"ST_NFS": 5 * BLOCK, "ST_S3": 4 * BLOCK}
    group_usage = rt.index.group_usage(["tiers"])[0]
    assert group_usage.by_type == usage.by_type and group_usage.keys == 5


def test_a_type_under_the_threshold_copies_nothing(stack):
    _setup_tiers(stack, _group(threshold=0.5))
    rt = stack.runtime
    keys = [201, 202, 203, 204]
    _write_aged(stack, keys)  # 0.4 < 0.5
    group = _round(stack)
    assert group.copies == [] and _on(rt, keys, "s3_01") == []


def test_reclaim_goes_first_and_its_victims_are_not_copied(stack):
    # The reclaim watermark at 0.5 (5 blocks), the trigger at 0.3 (3 blocks): 8 blocks
    # written, the round reclaims the 3 coldest, then copies the coldest left.
    _setup_tiers(stack, _group(threshold=0.3, used_percentage=0.5))
    rt = stack.runtime
    keys = list(range(301, 309))
    _write_aged(stack, keys)
    group = _round(stack)
    assert group.victims == 3
    served = _on(rt, keys, "nfs_01")
    assert served == keys[3:]
    (copy,) = group.copies
    copied = _on(rt, keys, "s3_01")
    assert copied == served[: copy.blocks] and copy.blocks == len(served)
    out = json.loads(stack.sfn.describe_execution(executionArn=copy.execution_arn)["output"])
    assert sum(r["served"] for r in out["results"]) == len(served)
    usage = rt.index.usage([rt.contexts("t1").layout])[0]
    assert usage.live().by_type == {"ST_NFS": 5 * BLOCK, "ST_S3": 5 * BLOCK}


def test_migrate_cache_with_a_sample_count_copies_the_coldest_blocks(stack):
    """No block_keys: rule.sample_count of the coldest blocks on the source (admin Copy:
    DELETE_SOURCE), never one the target holds; 0 selects up to 100."""
    _setup_tiers(stack, _group(threshold=0.99))
    rt = stack.runtime
    keys = [401, 402, 403, 404, 405]
    data = _write_aged(stack, keys)
    rt.index.read(rt.contexts("t1").layout, [401], MODE_PREFIX)  # now the warmest
    body = {
        "instance_id": "t1",
        "method": "MIGRATION_METHOD_COPY",
        "source_storage_name": "nfs_01",
        "target_storage_name": "s3_01",
    }
    answer = _api("migrateCache", {**body, "rule": {"sample_count": 2}})
    assert answer["header"]["status"]["code"] == "OK", answer
    assert (answer["accepted"], answer["rejected"]) == ("2", "0")
    assert wait_execution(stack.sfn, answer["execution_arn"], timeout_s=60)["status"] == "SUCCEEDED"
    assert _on(rt, keys, "s3_01") == [402, 403] and _on(rt, keys, "nfs_01") == [401, 404, 405]
    assert _s3_bytes(rt, 402) == data[402]
    answer = _api("migrateCache", {**body, "rule": {"sample_count": 0}})
    assert (answer["accepted"], answer["rejected"]) == ("3", "0")
    assert wait_execution(stack.sfn, answer["execution_arn"], timeout_s=60)["status"] == "SUCCEEDED"
    assert _on(rt, keys, "s3_01") == keys and _on(rt, keys, "nfs_01") == []
    usage = rt.index.usage([rt.contexts("t1").layout])[0]
    assert {t: n for t, n in usage.live().by_type.items() if n} == {"ST_S3": 5 * BLOCK}
    answer = _api("migrateCache", {**body, "rule": {}})  # nothing left on the source
    assert (answer["accepted"], answer["rejected"], answer["execution_arn"]) == ("0", "0", "")


def _copy_now(stack, keys):
    """A KEEP_BOTH Copy of ``keys`` to s3_01, done."""
    rt = stack.runtime
    arn = rt.tier_copies.submit(
        rt.contexts("t1"), "nfs_01", "s3_01", keys, MigrationRetention.MIGRATION_RETENTION_KEEP_BOTH
    )
    assert wait_execution(stack.sfn, arn, timeout_s=60)["status"] == "SUCCEEDED"


def _live(rt):
    usage = rt.index.usage([rt.contexts("t1").layout])[0].live()
    return {t: n // BLOCK for t, n in usage.by_type.items() if n}


def test_group_bytes_over_take_a_hot_copy_a_cold_one_covers_before_a_hot_only_block(stack):
    # 10 blocks' worth, reclaimed from 7: 6 blocks on NFS, the two warmest copied to S3 too
    # (8 blocks' worth): one block's worth over. The coldest block (601) only NFS holds; the
    # NFS copy of 605 goes instead, and 605 is still served from S3.
    _setup_tiers(stack, _group(threshold=0.99, used_percentage=0.7, capacity=NFS_BLOCKS * BLOCK))
    rt = stack.runtime
    # Every block in the sample (5 candidates per block needed would be 5 of these 6 or 7):
    # the order, not the sample's luck, is what is checked.
    rt.reclaim_job.reclaimer.config = SamplingConfig(oversample=100)
    keys = list(range(601, 607))
    _write_aged(stack, keys)
    _copy_now(stack, [605, 606])
    rt.clock.advance(DEFAULT_TRIGGER_PERIOD_S)
    group = _round(stack)
    assert group.victims == 1 and group.copies == []
    assert _on(rt, keys, "nfs_01") == [601, 602, 603, 604, 606]
    assert _on(rt, keys, "s3_01") == [605, 606]
    assert _live(rt) == {"ST_NFS": 5, "ST_S3": 2}
    assert rt.index.group_usage(["tiers"])[0].live().bytes == 7 * BLOCK
    # One more block: the NFS copy of 606, covered too, goes before any hot-only block.
    _write_aged(stack, [607])
    rt.clock.advance(DEFAULT_TRIGGER_PERIOD_S)
    assert _round(stack).victims == 1
    assert _on(rt, [*keys, 607], "nfs_01") == [601, 602, 603, 604, 607]
    # Nothing covered left: the coldest hot-only block goes, as without tiers.
    _write_aged(stack, [608])
    rt.clock.advance(DEFAULT_TRIGGER_PERIOD_S)
    assert _round(stack).victims == 1
    assert _on(rt, [*keys, 607, 608], "nfs_01") == [602, 603, 604, 607, 608]
    assert _served_storages(rt, [605, 606], BATCH) == ["s3_01", "s3_01"]
    assert _live(rt) == {"ST_NFS": 5, "ST_S3": 2}


def test_a_type_over_its_quota_is_reclaimed_whatever_other_tiers_hold(stack):
    # S3's quota 5 blocks, reclaimed from 3 (0.7): 4 blocks copied to S3 keep their NFS
    # copies; the coldest S3 location goes though NFS is the record's first copy.
    _setup_tiers(stack, _group(threshold=0.99, used_percentage=0.7, s3_blocks=5))
    rt = stack.runtime
    keys = list(range(701, 705))
    _write_aged(stack, keys)
    _copy_now(stack, keys)
    rt.clock.advance(DEFAULT_TRIGGER_PERIOD_S)
    group = _round(stack)
    assert group.victims == 1
    assert _on(rt, keys, "s3_01") == [702, 703, 704] and _on(rt, keys, "nfs_01") == keys
    assert _live(rt) == {"ST_NFS": 4, "ST_S3": 3}
