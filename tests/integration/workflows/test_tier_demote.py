"""Demote instead of delete (issue 24, item 4): a reclaim round's victims on the source of a
``demote_on_reclaim`` strategy go to its target with DELETE_SOURCE through the real tier_copy
ASL in moto (real Valkey, moto S3, NFS files); their bytes count as freed from the round's
begin to the copy's end; a refused or unstartable demote, a victim the target covers and a
victim of the last tier are dropped. The injected clock orders the blocks' recency."""

import threading

import pytest

from chalicelib.capacity import SamplingConfig
from chalicelib.clock import ManualClock
from chalicelib.index import Status
from chalicelib.protocol.codes import MigrationRetention, QueryType
from chalicelib.protocol.models import DEFAULT_TRIGGER_PERIOD_S, GetCacheLocationRequest, InstanceGroup
from chalicelib.workflows import demotion, migrations

from .harness import wait_execution, wait_for
from .test_tier_copy import (
    BATCH,
    BLOCK,
    ROUTE,
    _completed,
    _exported,
    _locations,
    _s3_bytes,
    _served_storages,
    _setup_tiers,
    _write,
)
from .test_tier_triggers import _group as trigger_group
from .test_tier_triggers import _on, _write_aged

pytestmark = pytest.mark.slow  # the demotes wait for a state machine run on the wall clock

#: The reclaimer's demote counter of the route nfs_01 -> s3_01.
DEMOTED = ("cache_reclaimer.block_demote_count", ROUTE)


@pytest.fixture
def workflow_clock():
    return ManualClock()


def _group(s3_blocks: int = 0, capacity: int = 1 << 30) -> InstanceGroup:
    """NFS's type quota NFS_BLOCKS blocks, reclaimed from half (5 blocks), a step of 100 %;
    nfs_01 -> s3_01 demotes (its copy trigger never fires: 0.99)."""
    return trigger_group(0.99, 0.5, capacity, s3_blocks, demote_on_reclaim=True)


def _setup(stack, group: InstanceGroup) -> None:
    """``_setup_tiers``, every block in each round's sample: the order, not the sample's
    luck, is what is checked."""
    _setup_tiers(stack, group)
    stack.runtime.reclaim_job.reclaimer.config = SamplingConfig(oversample=100)


def _round(stack):
    """One reclaim round (the trigger period after the last), its group report."""
    rt = stack.runtime
    rt.clock.advance(DEFAULT_TRIGGER_PERIOD_S)
    (group,) = [g for g in rt.reclaim_job.reclaimer.run_round().groups if g.group == "tiers"]
    assert not group.error, group.error
    return group


def _demotes(group):
    return [arn for report in group.instances for arn in report.demote_executions]


def _usage(rt):
    return rt.index.usage([rt.contexts("t1").layout])[0]


def _blocks(by_type):
    return {t: n // BLOCK for t, n in by_type.items() if n}


def _only_on(rt, keys, storage):
    """Whether each key has exactly one location: SERVING on ``storage``."""
    return _locations(rt, keys) == [[(storage, Status.SERVING)]] * len(keys)


@pytest.fixture
def copy_gate(monkeypatch):
    """The tier_copy CopyBytes task holds until the gate opens (then copies for real)."""
    gate = threading.Event()
    real = migrations.copy_blocks

    def held(*args, **kwargs):
        assert gate.wait(30), "the gate never opened"
        return real(*args, **kwargs)

    monkeypatch.setattr(migrations, "copy_blocks", held)
    yield gate
    gate.set()


def test_an_nfs_tier_over_its_watermark_demotes_its_coldest_blocks_to_s3(stack, copy_gate):
    _setup(stack, _group())
    rt = stack.runtime
    keys = list(range(801, 809))  # 8 blocks: 3 over the watermark (5)
    data = _write_aged(stack, keys)
    group = _round(stack)
    assert (group.victims, group.demoted) == (0, 3)
    (arn,) = _demotes(group)
    coldest = keys[:3]
    assert [locs for locs in _locations(rt, coldest)] == [[("nfs_01", Status.SERVING), ("s3_01", Status.WRITING)]] * 3
    # Begun in the round: the pending bytes count as freed while the copy runs.
    usage = _usage(rt)
    assert _blocks(usage.demoting_by_type) == {"ST_NFS": 3}
    assert _blocks(usage.live().by_type) == {"ST_NFS": 8, "ST_S3": 3}
    assert _blocks(usage.reclaimable().by_type) == {"ST_NFS": 5, "ST_S3": 3}
    again = _round(stack)
    assert (again.victims, again.demoted, _demotes(again)) == (0, 0, [])
    copy_gate.set()
    assert wait_execution(stack.sfn, arn, timeout_s=60)["status"] == "SUCCEEDED"
    # The sources deleted (after the group's delete delay): S3 only holds them, the same bytes.
    assert wait_for(lambda: _only_on(rt, coldest, "s3_01"), 20)
    assert all(_s3_bytes(rt, key) == data[key] for key in coldest)
    assert _on(rt, keys, "nfs_01") == keys[3:]
    assert _served_storages(rt, coldest, BATCH) == ["s3_01"] * 3
    usage = _usage(rt)
    assert (usage.demoting_by_type, usage.deleting_bytes) == ({}, 0)
    assert _blocks(usage.by_type) == {"ST_NFS": 5, "ST_S3": 3}
    assert (usage.bytes, usage.keys) == (8 * BLOCK, 8)
    assert _blocks(usage.by_storage) == {"nfs_01": 5, "s3_01": 3}
    group_usage = rt.index.group_usage(["tiers"])[0]
    assert (group_usage.bytes, group_usage.keys, group_usage.by_type) == (8 * BLOCK, 8, usage.by_type)
    assert {k: v for k, v in _exported("").items() if k[0] in (DEMOTED[0], "migration.tasks_submitted_total")} == {
        DEMOTED: 3,
        ("migration.tasks_submitted_total", ROUTE): 3,
    }
    assert _exported("migration.tasks_completed_total") == {_completed("success"): 3}
    # At the watermark now: nothing more goes.
    last = _round(stack)
    assert (last.victims, last.demoted) == (0, 0)


def test_a_round_begins_a_bounded_execution_and_the_next_round_takes_the_rest(stack, copy_gate, monkeypatch):
    # Two batches per instance and round (here one block each, as the round picks them):
    # the third victim waits. The next round, while the first copy runs, finds the two
    # coldest held on S3 (WRITING there: neither demoted again nor dropped) and demotes it.
    monkeypatch.setattr(demotion, "EXECUTION_BATCHES", 2)
    _setup(stack, _group())
    rt = stack.runtime
    keys = list(range(871, 879))
    _write_aged(stack, keys)
    first = _round(stack)
    assert (first.victims, first.demoted) == (0, 2)
    second = _round(stack)
    assert (second.victims, second.demoted) == (0, 1)
    assert _blocks(_usage(rt).demoting_by_type) == {"ST_NFS": 3}
    copy_gate.set()
    for arn in _demotes(first) + _demotes(second):
        assert wait_execution(stack.sfn, arn, timeout_s=60)["status"] == "SUCCEEDED"
    assert wait_for(lambda: _only_on(rt, keys[:3], "s3_01"), 20)
    assert _exported(DEMOTED[0]) == {DEMOTED: 3}
    assert _exported("migration.tasks_submitted_total") == {("migration.tasks_submitted_total", ROUTE): 3}


def _broken(*args, **kwargs):
    raise RuntimeError("the copy task crashed")


def test_a_demote_whose_execution_dies_holds_its_count_until_the_reaper_fails_it(stack, monkeypatch):
    _setup(stack, _group())
    rt = stack.runtime
    keys = list(range(861, 869))
    _write_aged(stack, keys)
    monkeypatch.setattr(migrations, "copy_blocks", _broken)
    monkeypatch.setattr(migrations.CopyTasks, "finish", lambda self, event: _broken())
    group = _round(stack)
    assert group.demoted == 3
    (arn,) = _demotes(group)
    assert wait_execution(stack.sfn, arn, timeout_s=60)["status"] == "FAILED"
    # The sessions outlive the execution: still pending, so no round demotes or drops more.
    assert _blocks(_usage(rt).demoting_by_type) == {"ST_NFS": 3}
    again = _round(stack)
    assert (again.victims, again.demoted) == (0, 0)
    rt.clock.advance(migrations.COPY_SESSION_TTL_S)
    # One session per run of victims the round marked at once: here one block each.
    assert rt.session_reaper.expire_write_sessions()["expired"] == 3
    assert _usage(rt).demoting_by_type == {}
    # Kept broken until now: moto's Map may still run a batch of the failed execution.
    monkeypatch.undo()
    # The failed targets deleted, reclaim demotes again: the coldest blocks now, which are
    # the next three (marking a location DELETING stamps its record's last access).
    assert wait_for(lambda: _on(rt, keys, "s3_01") == [] and all(len(x) == 1 for x in _locations(rt, keys)), 20)
    group = _round(stack)
    assert group.demoted == 3
    (arn,) = _demotes(group)
    assert wait_execution(stack.sfn, arn, timeout_s=60)["status"] == "SUCCEEDED"
    assert wait_for(lambda: _only_on(rt, keys[3:6], "s3_01"), 20)
    assert _on(rt, keys, "nfs_01") == keys[:3] + keys[6:]
    assert _usage(rt).demoting_by_type == {}


def test_a_demote_the_cold_type_quota_refuses_drops_its_victims(stack):
    # Room on S3 for 2 blocks: the two coldest are demoted, the third's begin is refused
    # (writing nothing) and it is dropped in the same round.
    _setup(stack, _group(s3_blocks=2))
    rt = stack.runtime
    keys = list(range(811, 819))
    _write_aged(stack, keys)
    group = _round(stack)
    assert (group.victims, group.demoted) == (1, 2)
    (arn,) = _demotes(group)
    assert wait_execution(stack.sfn, arn, timeout_s=60)["status"] == "SUCCEEDED"
    assert wait_for(lambda: _only_on(rt, keys[:2], "s3_01") and _locations(rt, keys[2:3]) == [[]], 20)
    assert _on(rt, keys, "nfs_01") == keys[3:]
    usage = _usage(rt)
    assert (usage.demoting_by_type, _blocks(usage.by_type)) == ({}, {"ST_NFS": 5, "ST_S3": 2})
    assert _exported("migration.tasks_") == {
        ("migration.tasks_submitted_total", ROUTE): 3,
        _completed("success"): 2,
        _completed("refused"): 1,
    }
    assert _exported(DEMOTED[0]) == {DEMOTED: 2}
    # NFS at its watermark: no later round demotes again. S3, the last tier, is over its own
    # (1 block): its coldest block is dropped.
    group = _round(stack)
    assert (group.victims, group.demoted) == (1, 0)
    assert wait_for(lambda: _locations(rt, keys[:2]) == [[], [("s3_01", Status.SERVING)]], 20)


def test_a_prefix_chain_is_demoted_parents_included_and_stays_readable(stack):
    # One start of 8 keys: a chain whose every block but the last has a child. A drop takes
    # leaves only (a parent's drop would cut its children's prefix); a demote keeps the block
    # readable, so the parents go too: 3 over the watermark, 3 demoted in one round (with
    # leaves only, one: the demoted leaf keeps its record, so its parent never turns leaf).
    _setup(stack, _group())
    rt = stack.runtime
    keys = list(range(841, 849))
    data = _write(rt, keys)
    group = _round(stack)
    assert (group.victims, group.demoted) == (0, 3)
    (arn,) = _demotes(group)
    assert wait_execution(stack.sfn, arn, timeout_s=60)["status"] == "SUCCEEDED"
    demoted = _on(rt, keys, "s3_01")
    assert len(demoted) == 3 and wait_for(lambda: all(_only_on(rt, [k], "s3_01") for k in demoted), 20)
    assert all(_s3_bytes(rt, key) == data[key] for key in demoted)
    # The whole chain still matches as a prefix, served from both tiers.
    found = rt.cache.get_cache_location(
        GetCacheLocationRequest(instance_id="t1", block_keys=keys, query_type=QueryType.QT_PREFIX_MATCH)
    )
    assert len(found.locations) == len(keys)
    assert _blocks(_usage(rt).by_type) == {"ST_NFS": 5, "ST_S3": 3}


def test_a_refused_demote_drops_only_leaves_of_a_chain(stack):
    # No room on S3: every demote is refused and its victims dropped, but only the chain's
    # leaf may be dropped; its parents stay (a later round takes them once leaves).
    _setup(stack, _group(s3_blocks=1))
    rt = stack.runtime
    _write(rt, [990])  # S3's one block of room taken by a block demoted first
    keys = list(range(851, 858))
    _write(rt, keys)
    rt.clock.advance(10)
    _round(stack)
    found = rt.cache.get_cache_location(
        GetCacheLocationRequest(instance_id="t1", block_keys=keys, query_type=QueryType.QT_PREFIX_MATCH)
    )
    # Whatever was demoted or dropped, the chain is cut at its end only.
    assert len(found.locations) == len(keys) - len([k for k in keys if _locations(rt, [k]) == [[]]])


def test_a_demote_whose_execution_cannot_start_drops_its_victims(stack, monkeypatch):
    _setup(stack, _group())
    rt = stack.runtime
    keys = list(range(821, 829))
    _write_aged(stack, keys)
    monkeypatch.setattr(rt.tier_copies.machine, "arn", "")  # StartExecution refused
    group = _round(stack)
    assert (group.victims, group.demoted, _demotes(group)) == (3, 0, [])
    # The sessions begun in the round were failed: nothing WRITING, the count given back.
    assert _usage(rt).demoting_by_type == {}
    assert wait_for(lambda: all(locs == [] for locs in _locations(rt, keys[:3])), 20)
    assert wait_for(lambda: _blocks(_usage(rt).by_type) == {"ST_NFS": 5}, 20)
    assert _usage(rt).bytes == 5 * BLOCK
    assert DEMOTED not in _exported("cache_reclaimer.")


def test_victims_the_target_holds_already_are_dropped_without_a_copy(stack):
    _setup(stack, _group())
    rt = stack.runtime
    keys = list(range(831, 839))
    _write_aged(stack, keys)
    arn = rt.tier_copies.submit(
        rt.contexts("t1"), "nfs_01", "s3_01", keys[:3], MigrationRetention.MIGRATION_RETENTION_KEEP_BOTH
    )
    assert wait_execution(stack.sfn, arn, timeout_s=60)["status"] == "SUCCEEDED"
    group = _round(stack)
    assert (group.victims, group.demoted, _demotes(group)) == (3, 0, [])
    assert wait_for(lambda: _only_on(rt, keys[:3], "s3_01"), 20)
    assert _served_storages(rt, keys[:3], BATCH) == ["s3_01"] * 3
    assert _blocks(_usage(rt).live().by_type) == {"ST_NFS": 5, "ST_S3": 3}
    assert _exported("migration.tasks_submitted_total") == {("migration.tasks_submitted_total", ROUTE): 3}
    assert DEMOTED not in _exported("cache_reclaimer.")


def test_victims_of_the_last_tier_are_dropped(stack):
    # S3 has no demote route from it: over its type quota, its coldest copies go.
    _setup(stack, _group(s3_blocks=4))
    rt = stack.runtime
    keys = list(range(841, 845))
    _write_aged(stack, keys)
    arn = rt.tier_copies.submit(
        rt.contexts("t1"), "nfs_01", "s3_01", keys, MigrationRetention.MIGRATION_RETENTION_DELETE_SOURCE
    )
    assert wait_execution(stack.sfn, arn, timeout_s=60)["status"] == "SUCCEEDED"
    assert wait_for(lambda: _only_on(rt, keys, "s3_01"), 20)
    group = _round(stack)  # 4 of 4 blocks, reclaimed from 2
    assert (group.victims, group.demoted, _demotes(group)) == (2, 0, [])
    assert wait_for(lambda: _locations(rt, keys) == [[], [], *[[("s3_01", Status.SERVING)]] * 2], 20)
    assert DEMOTED not in _exported("cache_reclaimer.")


def test_a_group_bytes_need_drops_for_a_demote_would_free_none_of_it(stack):
    # The group's total over (5 blocks, reclaimed from 4), NFS at its own watermark: the
    # bytes a demote moves stay in the group, so the coldest block is dropped.
    _setup(stack, _group(capacity=8 * BLOCK))
    rt = stack.runtime
    keys = list(range(851, 856))
    _write_aged(stack, keys)
    group = _round(stack)
    assert (group.victims, group.demoted, _demotes(group)) == (1, 0, [])
    assert wait_for(lambda: _locations(rt, keys[:1]) == [[]], 20)
    assert _on(rt, keys, "nfs_01") == keys[1:]
    assert DEMOTED not in _exported("cache_reclaimer.")


def test_a_sharded_instance_demotes_with_each_shards_part_counted_there(stack, copy_gate):
    _setup(stack, _group().model_copy(update={"instance_shards": 3}))
    rt = stack.runtime
    layout = rt.contexts("t1").layout
    assert layout.shard_count == 3
    keys = [(i % 3 << 40) + 881 + i for i in range(8)]  # shard = (key >> 40) mod 3, in turn
    data = _write_aged(stack, keys)
    group = _round(stack)
    assert (group.victims, group.demoted) == (0, 3)
    (arn,) = _demotes(group)
    # The three coldest, one per shard: each shard counts its own.
    assert [_blocks(rt.index.usage([shard])[0].demoting_by_type) for shard in layout.shards] == [{"ST_NFS": 1}] * 3
    assert (_round(stack).victims, _round(stack).demoted) == (0, 0)
    copy_gate.set()
    assert wait_execution(stack.sfn, arn, timeout_s=60)["status"] == "SUCCEEDED"
    assert wait_for(lambda: _only_on(rt, keys[:3], "s3_01"), 20)
    assert all(_s3_bytes(rt, key) == data[key] for key in keys[:3])
    usage = _usage(rt)
    assert (usage.demoting_by_type, _blocks(usage.by_type)) == ({}, {"ST_NFS": 5, "ST_S3": 3})
    assert rt.index.group_usage(["tiers"])[0].by_type == usage.by_type
