"""Tiered Mark on a real Valkey (chalicelib/index/migration.py ``mark``, lua/start.lua,
lua/finish.lua): the next start of a marked block writes it to the target, its finish
clears the Mark as the policy says, an unavailable or full target leaves a normal write and
the Mark, an expired or malformed Mark is cleared, and the counters stay exact under threads."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from chalicelib.index import Status
from chalicelib.index.errors import QuotaExceededError
from chalicelib.index.layout import MarkClear, RecordFlag
from chalicelib.index.migration import CopyTarget, MigrationIndex
from chalicelib.index.types import MODE_RAW, Candidate, MarkClearing, bucket_index

from .test_block_index import SIZES, start

S3 = Candidate("s3_01", "ST_S3", 0, 0, -1, False)
NFS2 = Candidate("nfs_02", "ST_NFS2", 4, 0, -1, True)
#: Spec groups of SIZES: 0 every spec (a, b), 1 spec a, 2 spec b; byte w * 3 + h is '1'
#: when a location of group h holds every spec of group w.
COVERS = b"100110101"
NEXT = MarkClearing(MarkClear.NEXT_WRITE)
FULL = MarkClearing(MarkClear.FULL_BLOCK, COVERS)
DAY_MS = 86_400_000


@pytest.fixture
def migration(index):
    return MigrationIndex(index)


def now_ms(index):
    return int(index.clock.now() * 1000)


def finish(index, layout, sid, success, clear=NEXT):
    session = index.session(layout, sid)
    return index.finish(layout, sid, session, success, SIZES, mark_clear=clear)


def served(index, layout, keys, sid="w0"):
    start(index, layout, keys, sid=sid)
    finish(index, layout, sid, [True] * len(keys))


def mark(migration, layout, keys, target=S3, ttl_ms=DAY_MS):
    return migration.mark(layout, keys, target.name, target.storage_type, now_ms(migration.index) + ttl_ms, COVERS, 3)


def marks(index, layout):
    return int(index.client.hget(layout.key("u"), "mk") or 0)


def storages(index, layout, key):
    names = index.storage_names(layout)
    (record,) = index.read(layout, [key], MODE_RAW)
    return sorted((names[loc.storage_index], loc.spec_group, loc.status) for loc in record.locations)


def raw(index, layout, key):
    (rec,) = index.read_raw(layout, [key], MODE_RAW)
    return rec


def test_the_next_start_writes_a_marked_block_to_the_target_and_its_finish_clears_the_mark(index, migration):
    layout = index.layout("inst", 4, group="g1")
    served(index, layout, [1, 2, 3])
    before = raw(index, layout, 1)
    result = mark(migration, layout, [1, 2, 99])
    assert (result.outcomes, result.accepted, result.rejected, result.active) == ("11g", 2, 1, 2)
    # A Mark costs its 7 bytes on the marked records only.
    assert len(raw(index, layout, 1)) == len(before) + 7 and len(raw(index, layout, 3)) == len(before)
    assert raw(index, layout, 1)[0] & RecordFlag.MARKED
    usage = index.usage([layout])[0]

    out = start(index, layout, [1, 2, 3], sid="w1", more_candidates=[S3])
    # Keys 1 and 2 are written again, to s3_01 (candidate 2); key 3 is masked as before.
    assert out.new_flags == [True, True, False] and out.written_to == (2, 2, 0)
    assert out.marks.routed == 2 and out.created == 0
    after = index.usage([layout])[0]
    assert (after.bytes, after.keys) == (usage.bytes + 400, usage.keys)
    assert after.by_type.get("ST_S3") == 400 and after.by_storage["s3_01"] == 400
    assert marks(index, layout) == 2  # kept until the write finishes

    done = finish(index, layout, "w1", [True, False])
    assert done.marks.consumed == 1 and done.marks.active == 1
    assert storages(index, layout, 1) == [("nfs_01", 0, Status.SERVING), ("s3_01", 0, Status.SERVING)]
    assert len(raw(index, layout, 1)) == len(before) + 16  # one more location, the Mark gone
    # Key 2's write failed: its Mark stays, and the next start routes it again once its
    # failed location (DELETING on s3, addressed by key) is gone.
    assert raw(index, layout, 2)[0] & RecordFlag.MARKED and marks(index, layout) == 1
    index.drop(layout, done.victims, SIZES)
    again = start(index, layout, [2], sid="w2", more_candidates=[S3])
    assert again.written_to == (2,)
    assert finish(index, layout, "w2", [True]).marks.consumed == 1 and marks(index, layout) == 0
    group = index.group_usage(["g1"])[0]
    assert group.by_type == {"ST_NFS": 600, "ST_S3": 400}


def test_full_block_covered_keeps_the_mark_until_the_target_holds_every_spec(index, layout, migration):
    served(index, layout, [1, 2])
    mark(migration, layout, [1, 2], target=NFS2)
    # A write of spec group 1 (spec a only) goes to the target, but covers half the block.
    start(index, layout, [1, 2], sid="w1", spec_groups=[1, 1], covers=COVERS, more_candidates=[NFS2])
    assert finish(index, layout, "w1", [True, True], clear=FULL).marks.consumed == 0
    assert marks(index, layout) == 2
    # The whole block (group 0) written there clears it; a NEXT_WRITE policy would have at once.
    out = start(index, layout, [1], sid="w2", covers=COVERS, more_candidates=[NFS2])
    assert out.written_to == (2,)
    assert finish(index, layout, "w2", [True], clear=FULL).marks.consumed == 1
    assert start(index, layout, [2], sid="w3", spec_groups=[2], covers=COVERS, more_candidates=[NFS2]).written_to == (
        2,
    )
    assert finish(index, layout, "w3", [True], clear=NEXT).marks.consumed == 1
    assert marks(index, layout) == 0


def test_a_target_not_offered_or_full_gets_a_normal_write_and_keeps_the_mark(index, layout, migration):
    served(index, layout, [1, 2, 3])
    mark(migration, layout, [1, 2, 3])
    # s3_01 not among the candidates (disabled, unhealthy, not a candidate): masked as before.
    out = start(index, layout, [1, 2, 3], sid="w1")
    assert out.new_flags == [False] * 3 and out.marks.routed == 0
    # s3_01 offered with room for one block of its type: the first is routed, the others not.
    full = Candidate("s3_01", "ST_S3", 0, 200, -1, False)
    out = start(index, layout, [1, 2, 3], sid="w2", more_candidates=[full])
    assert out.written_to == (2, 0, 0) and index.usage([layout])[0].by_type["ST_S3"] == 200
    assert marks(index, layout) == 3
    assert all(raw(index, layout, k)[0] & RecordFlag.MARKED for k in (1, 2, 3))


def test_an_expired_or_malformed_mark_is_cleared_by_the_next_start(index, layout, migration):
    served(index, layout, [1, 2, 3])
    mark(migration, layout, [1], ttl_ms=1_000)
    mark(migration, layout, [2], ttl_ms=DAY_MS)
    plain = raw(index, layout, 3)
    # Key 3: the flag without the bytes (malformed), counted as a Mark when it was set.
    bucket = layout.bucket(bucket_index(3, index.bucket_count(layout)))
    index.client.hset(bucket, (3).to_bytes(8, "big"), bytes([plain[0] | RecordFlag.MARKED]) + plain[1:])
    index.client.hincrby(layout.key("u"), "mk", 1)
    index.clock.advance(2)
    out = start(index, layout, [1, 2, 3], sid="w1")  # s3_01 not offered
    assert (out.marks.expired, out.marks.malformed, out.marks.active) == (1, 1, 1)
    assert not raw(index, layout, 1)[0] & RecordFlag.MARKED and raw(index, layout, 3) == plain
    assert raw(index, layout, 2)[0] & RecordFlag.MARKED and marks(index, layout) == 1


def test_threads_racing_starts_on_marked_keys_write_each_once_with_exact_counters(index, layout, migration):
    keys = list(range(1, 65))
    served(index, layout, keys)
    assert mark(migration, layout, keys).accepted == 64
    usage = index.usage([layout])[0]

    def race(t):
        out = start(index, layout, keys, sid=f"r{t}", more_candidates=[S3])
        return out.marks.routed

    with ThreadPoolExecutor(8) as pool:
        routed = list(pool.map(race, range(8)))
    assert sum(routed) == 64
    after = index.usage([layout])[0]
    assert after.bytes == usage.bytes + 64 * 200 and after.by_type["ST_S3"] == 64 * 200
    consumed = 0
    for t in range(8):
        session = index.session(layout, f"r{t}")
        if session is not None:
            consumed += finish(index, layout, f"r{t}", [True] * len(session.entries)).marks.consumed
    assert consumed == 64 and marks(index, layout) == 0
    assert all(len(storages(index, layout, k)) == 2 for k in keys)


def test_a_copy_to_the_target_clears_its_mark(index, layout, migration):
    served(index, layout, [1, 2])
    mark(migration, layout, [1, 2])
    records = index.read(layout, [1, 2], MODE_RAW)
    sources = [(k, r.locations[0].location_id) for k, r in zip([1, 2], records, strict=True)]
    target = CopyTarget("s3_01", "ST_S3", pack_count=0, by_location=False)
    migration.begin_copy(
        layout, sources, target, SIZES, "c1", now_ms(index) + 60_000, covers=COVERS, spec_group_count=3
    )
    done = migration.finish_copy(layout, "c1", [True, False], SIZES, NEXT)
    assert done.marks.consumed == 1 and marks(index, layout) == 1
    assert not raw(index, layout, 1)[0] & RecordFlag.MARKED and raw(index, layout, 2)[0] & RecordFlag.MARKED


def test_a_block_the_target_holds_is_not_marked_and_a_dropped_record_takes_its_mark(index, layout, migration):
    served(index, layout, [1, 2])
    mark(migration, layout, [1])
    start(index, layout, [1], sid="w1", more_candidates=[S3])
    finish(index, layout, "w1", [True])
    assert mark(migration, layout, [1, 1, 2]).outcomes == "cc1"
    victims = index.mark_deleting(layout, [2], SIZES)
    index.drop(layout, victims, SIZES)
    assert index.read(layout, [2], MODE_RAW) == [None] and marks(index, layout) == 0


def test_a_mark_on_an_instance_of_255_storages_is_refused(index, layout, migration):
    served(index, layout, [1])
    index.client.hset(layout.key("m"), "storages", 255)
    with pytest.raises(QuotaExceededError):
        mark(migration, layout, [1])
    assert marks(index, layout) == 0


def test_an_adopted_record_keeps_its_mark_behind_its_adopter(index, layout, migration):
    served(index, layout, [1, 2])
    # Key 1 goes; its child 2 stays, linked to no record until 1 is written again.
    index.drop(layout, index.mark_deleting(layout, [1], SIZES), SIZES)
    mark(migration, layout, [2])
    out = start(index, layout, [1, 2], sid="w1", more_candidates=[S3])
    assert out.written_to == (1, 2)  # 1 created anew (adopting 2), 2 written to its target
    rec = raw(index, layout, 2)
    assert rec[0] & RecordFlag.ADOPTED and rec[0] & RecordFlag.MARKED
    assert finish(index, layout, "w1", [True, True]).marks.consumed == 1
    rec = raw(index, layout, 2)
    assert rec[0] & RecordFlag.ADOPTED and not rec[0] & RecordFlag.MARKED
    (parent,) = index.read(layout, [1], MODE_RAW)
    assert parent.children == 1  # the adopter tail survived the Mark's coming and going
