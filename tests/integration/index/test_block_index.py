"""The index scripts against a real Valkey: transitions, usage, sessions."""

import pytest

from chalicelib.index import Status
from chalicelib.index.errors import QuotaExceededError, WriteSessionError
from chalicelib.index.types import MODE_BATCH, MODE_PREFIX, MODE_RAW, MODE_WINDOW, StartRequest

SIZES = [200, 100, 100]


def start(index, layout, keys, sid="s1", **kw):
    req = StartRequest(
        session_id=sid,
        deadline_ms=int(index.clock.now() * 1000) + 30_000,
        storage_name="nfs_01",
        storage_type="ST_NFS",
        pack_count=kw.pop("pack", 8),
        sizes=[200, 100, 100],
        spec_groups=kw.pop("spec_groups", [0] * len(keys)),
        **kw,
    )
    return index.start(layout, keys, req)


def finish(index, layout, sid, success):
    session = index.session(layout, sid)
    if session is None:
        raise WriteSessionError("gone")
    finished = index.finish(layout, sid, session, success, SIZES)
    return finished.expired, finished.victims


def test_start_finish_read_roundtrip(index, layout):
    out = start(index, layout, [1, 2, 3])
    assert out.new_flags == [True, True, True]
    assert index.read(layout, [1, 2, 3], MODE_PREFIX) == []
    expired, victims = finish(index, layout, "s1", [True, True, False])
    assert not expired
    assert [v.block_key for v in victims] == [3]
    recs = index.read(layout, [1, 2, 3], MODE_PREFIX)
    assert len(recs) == 2
    assert recs[1].parent == 1 and recs[0].parent is None
    assert recs[0].children == 1
    assert recs[0].locations[0].status == Status.SERVING
    assert recs[0].locations[0].group_id == out.first_location_id
    assert recs[1].locations[0].slot == 1
    usage = index.usage([layout])[0]
    assert usage.bytes == 600 and usage.keys == 3
    out = index.drop(layout, victims, SIZES)
    assert out.dropped == 1 and out.orphan_groups == []
    usage = index.usage([layout])[0]
    assert usage.bytes == 400 and usage.keys == 2 and usage.by_type == {"ST_NFS": 400}
    assert index.read(layout, [1, 2], MODE_RAW)[0].children == 1


def test_child_counts_follow_new_keys_within_and_across_starts(index, layout):
    """A parent counts each new key written right after it, whether it is new in the same
    call, already stored, or named twice; a repeated key is written once."""
    assert start(index, layout, [1, 2, 3]).new_flags == [True, True, True]
    assert start(index, layout, [1, 2, 4, 2, 5], sid="s2").new_flags == [False, False, True, False, True]
    records = dict(zip([1, 2, 3, 4, 5], index.read(layout, [1, 2, 3, 4, 5], MODE_RAW), strict=True))
    assert {k: r.children for k, r in records.items()} == {1: 1, 2: 3, 3: 0, 4: 0, 5: 0}
    assert {k: r.parent for k, r in records.items()} == {1: None, 2: 1, 3: 2, 4: 2, 5: 2}


def test_duplicate_writer_masked(index, layout):
    start(index, layout, [1, 2])
    out = start(index, layout, [1, 2, 3, 4], sid="s2")
    assert out.new_flags == [False, False, True, True]
    with pytest.raises(WriteSessionError):
        finish(index, layout, "s2", [True])
    finish(index, layout, "s2", [True, True])
    with pytest.raises(WriteSessionError):
        finish(index, layout, "s2", [True, True])


def test_quota_refusal_leaves_nothing(index, layout):
    with pytest.raises(QuotaExceededError):
        start(index, layout, [1, 2, 3], group_capacity=500)
    assert index.read(layout, [1], MODE_RAW) == [None]
    assert index.usage([layout])[0].bytes == 0
    with pytest.raises(QuotaExceededError):
        start(index, layout, [1, 2, 3], max_keys=2)


def test_a_256th_storage_is_refused_not_wrapped_to_index_0(index, layout, valkey):
    start(index, layout, [1])  # nfs_01 gets index 1
    valkey.hset(layout.key("m"), "storages", 255)  # as if 254 more storages had been written to
    req = StartRequest(
        session_id="s2",
        deadline_ms=int(index.clock.now() * 1000) + 30_000,
        storage_name="nfs_99",
        storage_type="ST_NFS",
        pack_count=8,
        sizes=[200, 100, 100],
        spec_groups=[0],
    )
    with pytest.raises(QuotaExceededError) as refused:
        index.start(layout, [2], req)
    assert refused.value.kind == "storages" and "nfs_99" in str(refused.value)
    assert index.read(layout, [2], MODE_RAW) == [None]
    assert start(index, layout, [3], sid="s3").storage_index == 1  # storages it knows still take writes


def test_window_and_batch(index, layout):
    start(index, layout, [1, 2, 3, 4, 5, 6])
    finish(index, layout, "s1", [True] * 6)
    victims = index.mark_deleting(layout, [6], SIZES)
    assert len(victims) == 1
    recs = index.read(layout, [1, 2, 3, 4, 5, 6, 7], MODE_WINDOW, 2)
    assert [r is not None for r in recs] == [False, False, False, True, True, False, False]
    recs = index.read(layout, [1, 2, 3, 10, 5, 6, 7], MODE_WINDOW, 2)
    assert [r is not None for r in recs] == [False, True, True, False, False, False, False]
    recs = index.read(layout, [5, 6, 1], MODE_BATCH)
    assert [r is not None for r in recs] == [True, False, True]


@pytest.mark.parametrize(
    "servable,served",
    [(None, [True, True]), (["nfs_01"], [True, True]), (["*", "nfs_02"], [False, False]), ([], [False, False])],
)
def test_reads_serve_only_the_servable_storages(index, layout, servable, served):
    start(index, layout, [1, 2])
    finish(index, layout, "s1", [True, True])
    assert [r is not None for r in index.read_raw(layout, [1, 2], MODE_BATCH, servable=servable)] == served
    assert len(index.read_raw(layout, [1, 2], MODE_PREFIX, servable=servable)) == sum(served)
    assert [r is not None for r in index.read_raw(layout, [1, 2], MODE_RAW, servable=servable)] == [True, True]


def test_a_lost_deletion_is_handed_over_again_once_per_grace(index, layout, clock):
    start(index, layout, [1])
    finish(index, layout, "s1", [True])
    delay_ms = 5000
    assert len(index.mark_deleting(layout, [1], SIZES, delay_ms=delay_ms)) == 1  # its deletion is then lost
    assert index.mark_deleting(layout, [1], SIZES, resubmit_before_s=int(clock.now())) == []
    clock.advance(4 + index.DELETION_LOST_AFTER_S)  # within the delay it was handed over with, and the grace
    assert index.mark_deleting(layout, [1], SIZES, resubmit_before_s=int(clock.now())) == []
    clock.advance(1)
    again = index.mark_deleting(layout, [1], SIZES, resubmit_before_s=int(clock.now()))
    assert [v.block_key for v in again] == [1]
    clock.advance(1)  # the retry may still be running: not handed over a second time
    assert index.mark_deleting(layout, [1], SIZES, resubmit_before_s=int(clock.now())) == []
    assert index.mark_deleting(layout, [1], SIZES, serving_only=True, resubmit_before_s=int(clock.now()) + 1) == []


def test_a_location_is_pending_from_its_mark_to_its_drop(index, layout, clock):
    """Every script turning a location DELETING records it as pending in the same step
    (mark, failed finish); drop and restore take it out."""
    start(index, layout, [1, 2, 3])
    finish(index, layout, "s1", [True, True, False])
    assert index.client.zcard(layout.key("pd")) == 1
    victims = index.mark_deleting(layout, [1, 2], SIZES)
    assert index.client.zcard(layout.key("pd")) == 3
    index.restore(layout, victims[:1], SIZES)
    assert index.client.zcard(layout.key("pd")) == 2
    index.drop(layout, victims[1:], SIZES)
    assert index.client.zcard(layout.key("pd")) == 1
    clock.advance(index.DELETION_LOST_AFTER_S)
    assert index.overdue_deletions(layout, int(clock.now()), 10) == [(3, victims[0].location_id + 2)]


def test_packed_group_released_with_last_block(index, layout):
    out = start(index, layout, [1, 2, 3], pack=2)
    _, victims = finish(index, layout, "s1", [False, False, False])
    assert index.drop(layout, victims[:1], SIZES).orphan_groups == []
    second = index.drop(layout, victims[1:], SIZES)
    assert second.dropped == 2
    assert sorted(g for _, g in second.orphan_groups) == [out.first_location_id, out.first_location_id + 2]
    assert sorted(index.orphan_groups(layout)) == sorted(second.orphan_groups)
    # a retried drop deletes nothing twice
    assert index.drop(layout, victims, SIZES).dropped == 0


def test_expired_session_fails(index, layout, clock):
    start(index, layout, [1, 2])
    clock.advance(31)
    expired, victims = finish(index, layout, "s1", [True, True])
    assert expired and len(victims) == 2
    assert index.read(layout, [1, 2], MODE_PREFIX) == []


def test_a_mark_registers_its_deletions_as_due_in_the_scripts_round_trip(index, layout, clock, round_trips):
    start(index, layout, [1, 2, 3, 4])
    finish(index, layout, "s1", [True] * 4)
    index.mark_deleting(layout, [1], SIZES)  # warm: the script is loaded
    index.settle_due(index.due_deletions(2**40, 10)["inst"])
    before = round_trips()
    victims = index.mark_deleting(layout, [2], SIZES, delay_ms=5000)
    assert [v.block_key for v in victims] == [2]
    assert round_trips() - before == 1  # ZADD and EVALSHA in one pipeline
    # registered due no earlier than the location's pending deadline
    deadline = int(index.client.zscore(layout.key("pd"), index.client.zrange(layout.key("pd"), -1, -1)[0]))
    assert index.due_deletions(deadline - 1, 10) == {}
    assert list(index.due_deletions(deadline + index.DUE_STEP_S, 10)) == ["inst"]


def test_a_mark_on_a_server_without_the_script_registers_once_and_marks(index, layout, round_trips):
    start(index, layout, [1, 2])
    finish(index, layout, "s1", [True, True])
    index.client.script_flush()
    assert [v.block_key for v in index.mark_deleting(layout, [1], SIZES)] == [1]
    assert index.client.zcard(index._due_key) == 1
    assert index.read(layout, [1, 2], MODE_BATCH)[0] is None
