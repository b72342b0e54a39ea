"""Failures after a write was granted leave nothing WRITING: a start whose storage fails to
prepare the files, and a reaper round that races a client's late finish."""

from __future__ import annotations

import json
import shutil

from chalicelib.protocol.models import InstanceGroup, StorageConfig
from tests.integration.meta.harness import code, register, write


def statuses(http, keys) -> list[str]:
    metas = http("getCacheMeta", {"instance_id": "i1", "block_keys": keys})["metas"]
    return [json.loads(m)["status"] for m in metas]


def test_a_start_whose_files_cannot_be_created_leaves_nothing_writing(runtime, http, tmp_path):
    mount = tmp_path / "3fs"
    (mount / "kv").mkdir(parents=True)
    runtime.control.add_storage(
        StorageConfig.model_validate(
            {
                "global_unique_name": "tfs",
                "threefs": {
                    "mountpoint": str(mount),
                    "root_dir": "kv",
                    "key_count_per_file": 4,
                    "touch_file_when_create": True,
                },
            }
        )
    )
    runtime.control.create_group(
        InstanceGroup.model_validate({"name": "g1", "storage_candidates": ["tfs"], "quota": {"capacity": 1 << 30}})
    )
    register(http, "g1", "i1")
    shutil.rmtree(mount / "kv")  # the mount's root gone for a moment

    failed = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2, 3]})

    assert code(failed) == "IO_ERROR", failed
    assert statuses(http, [1, 2, 3]) == ["CLS_NOT_FOUND"] * 3
    usage = runtime.index.usage([runtime.contexts("i1").layout])[0]
    assert (usage.bytes, usage.keys) == (0, 0)
    (mount / "kv").mkdir()
    retried = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2, 3]})
    assert code(retried) == "OK" and len(retried["locations"]) == 3


def test_a_reaper_round_survives_a_late_finish_racing_it(runtime, http, instance, clock, monkeypatch):
    sessions = {
        key: http("startWriteCache", {"instance_id": "i1", "block_keys": [key]})["write_session_id"]
        for key in (1, 2, 3)
    }
    clock.advance(3600)
    due = runtime.index.due_sessions(["i1"], int(clock.now() * 1000))["i1"]
    racing = due[0]
    read_session = runtime.index.session
    raced = []

    def session_then_late_finish(layout, session_id):
        session = read_session(layout, session_id)
        # The client's late finish lands between the reaper's read and its finish.
        if session_id == racing and not raced:
            raced.append(session_id)
            late = http(
                "finishWriteCache",
                {"instance_id": "i1", "write_session_id": session_id, "success_blocks": {"offset": 1}},
            )
            assert code(late) == "INVALID_ARGUMENT"
        return session

    monkeypatch.setattr(runtime.index, "session", session_then_late_finish)
    result = runtime.session_reaper.expire_write_sessions()

    assert result == {"expired": 2, "blocks": 2}
    assert statuses(http, sorted(sessions)) == ["CLS_NOT_FOUND"] * 3


def test_removing_again_retries_a_deletion_whose_first_attempt_failed(runtime, http, clock):
    s3 = runtime.aws("s3")
    s3.create_bucket(Bucket="kv-blocks")
    runtime.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "s3_01", "s3": {"bucket": "kv-blocks", "prefix": "p", "region": "us-east-1"}}
        )
    )
    runtime.control.create_group(
        InstanceGroup.model_validate({"name": "g1", "storage_candidates": ["s3_01"], "quota": {"capacity": 1 << 30}})
    )
    register(http, "g1", "i1")
    write(http, [1, 2])
    s3.delete_bucket(Bucket="kv-blocks")  # S3 fails the deletion

    assert code(http("removeCache", {"instance_id": "i1", "block_keys": [2]})) == "IO_ERROR"
    assert statuses(http, [1, 2]) == ["CLS_SERVING", "CLS_DELETING"]  # no longer served, not deleted

    s3.create_bucket(Bucket="kv-blocks")
    # Right away it could still be in flight: a second deletion must not overlap it.
    assert code(http("removeCache", {"instance_id": "i1", "block_keys": [2]})) == "OK"
    assert statuses(http, [1, 2]) == ["CLS_SERVING", "CLS_DELETING"]
    clock.advance(runtime.index.DELETION_LOST_AFTER_S + 1)  # now it counts as lost
    assert code(http("removeCache", {"instance_id": "i1", "block_keys": [2]})) == "OK"
    assert statuses(http, [1, 2]) == ["CLS_SERVING", "CLS_NOT_FOUND"]
    assert runtime.index.usage([runtime.contexts("i1").layout])[0].keys == 1
    rewritten = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2]})
    assert rewritten["block_mask"] == {"offset": 1} and len(rewritten["locations"]) == 1


def test_a_timestamp_trim_leaves_a_block_written_again_during_its_scan(runtime, http, instance, clock, monkeypatch):
    write(http, [1, 2])
    written_us = int(clock.now() * 1e6)
    clock.advance(60)
    read_buckets = runtime.index.read_buckets

    def read_racing_a_rewrite(layout, buckets):
        entries = read_buckets(layout, buckets)
        # both keys are removed and written again after the purge read them
        assert code(http("removeCache", {"instance_id": "i1", "block_keys": [1, 2]})) == "OK"
        write(http, [1, 2])
        return entries

    monkeypatch.setattr(runtime.index, "read_buckets", read_racing_a_rewrite)
    trimmed = http(
        "trimCache",
        {
            "instance_id": "i1",
            "strategy": "TS_TIMESTAMP",
            "begin_timestamp": written_us - 1000,
            "end_timestamp": written_us + 1000,
        },
    )

    assert code(trimmed) == "OK"
    assert statuses(http, [1, 2]) == ["CLS_SERVING", "CLS_SERVING"]  # written a minute after the range


def test_a_remove_cache_cut_off_by_a_crash_is_recovered_from_its_pending_set(
    runtime, http, group, nfs_root, clock, monkeypatch
):
    """Issue #28 item 10: a removeCache whose process dies between the mark and the
    hand-off left its blocks DELETING, not rewritable and charged, until a sweep over
    every instance came by. They are pending from the mark, in the same atomic step: once
    due, the next reclaim round hands them over again; the files go, the bytes are
    released, the keys can be written again."""
    from pathlib import Path

    from chalicelib.cache.deletion import InlineDeleter

    register(http, "g1", "i1")
    for location in write(http, [1, 2, 3, 4])["locations"]:
        for spec in location["location_specs"]:
            path = Path(spec["uri"].split("?")[0][len("file://nfs_01") :])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * 2048)
    files = {p for p in nfs_root.rglob("*") if p.is_file()}
    layout = runtime.contexts("i1").layout

    def crash(self, ctx, victims, delay_ms=0):
        raise SystemExit("the container died before the hand-off")

    monkeypatch.setattr(InlineDeleter, "submit", crash)
    try:
        http("removeCache", {"instance_id": "i1", "block_keys": [1, 2, 3, 4]})
    except SystemExit:
        pass
    monkeypatch.undo()
    assert statuses(http, [1, 2, 3, 4]) == ["CLS_DELETING"] * 4
    assert runtime.index.usage([layout])[0].bytes == 4 * 2048
    runtime.reclaim_job.run()
    assert statuses(http, [1, 2, 3, 4]) == ["CLS_DELETING"] * 4  # not due yet: it could be in flight

    clock.advance(runtime.index.DELETION_LOST_AFTER_S + runtime.index.DUE_STEP_S)
    assert runtime.reclaim_job.run()["resubmitted"] == 4

    assert statuses(http, [1, 2, 3, 4]) == ["CLS_NOT_FOUND"] * 4
    assert files and not any(p.exists() for p in files)
    assert runtime.index.usage([layout])[0].bytes == 0
    assert runtime.index.group_usage(["g1"])[0].bytes == 0
    assert runtime.valkey.zcard(layout.key("pd")) == 0
    assert len(write(http, [1, 2])["locations"]) == 2  # rewritable


def test_a_trim_takes_the_blocks_a_concurrent_split_moved_past_its_walk(runtime, http, instance, monkeypatch):
    """Starts split buckets while a TS_REMOVE_ALL_CACHE trim walks the occupied set: records
    of a bucket it has not reached move to a new bucket, which the walk of the set may not
    return (SSCAN returns what was there throughout, not what was added: here each page is
    cut from the set as it was when the walk began). The trim still takes every block
    written before it, reading the buckets split off meanwhile."""
    from chalicelib.cache import purge

    monkeypatch.setattr(runtime.index, "RECORDS_PER_BUCKET", 2)
    monkeypatch.setattr(purge, "BUCKETS_PER_STEP", 2)
    old = list(range(1000, 1320, 7))
    for first in range(0, len(old), 8):
        write(http, old[first : first + 8])
    layout = runtime.contexts("i1").layout
    walked: list[int] = []
    fresh = iter(range(1_000_001, 10**9, 7))

    def snapshot_pages(layout_, cursor, count):
        if cursor == 0:
            walked[:] = sorted(int(m) for m in runtime.valkey.smembers(layout_.occupied))
        page = walked[cursor : cursor + count]
        write(http, [next(fresh) for _ in range(6)])  # three splits per page
        return (cursor + count if cursor + count < len(walked) else 0), page

    monkeypatch.setattr(runtime.index, "occupied_page", snapshot_pages)
    before = runtime.index.bucket_count(layout)
    assert code(http("trimCache", {"instance_id": "i1", "strategy": "TS_REMOVE_ALL_CACHE"})) == "OK"

    assert runtime.index.bucket_count(layout) > before
    assert set(statuses(http, old)) <= {"CLS_DELETING", "CLS_NOT_FOUND"}
