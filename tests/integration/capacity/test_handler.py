"""The entry points on a full runtime (real Valkey, moto DynamoDB, HTTP meta API):
a refused write wakes the reclaimer, the next round makes room, the lease is honoured."""

from __future__ import annotations

import json

import pytest
import redis

from chalicelib.protocol.models import InstanceGroup
from chalicelib.stores.lease import Lease
from tests.helpers import SPECS
from tests.integration.capacity.harness import full_group_api

BLOCK = 2048
WAKE_KEY = "{kvcm:reclaim}:wake"


@pytest.fixture
def runtime_settings(tmp_path):
    """This module's runtime: a table of its own, the events logged to a file the tests read."""
    return {"node_id": "this-node", "event_log_path": str(tmp_path / "events.log")}


@pytest.fixture
def http(runtime, tmp_path):
    # full at 8 blocks, and a watermark of 100 %: only a refused write makes room
    with full_group_api(runtime, tmp_path / "nfs", "gc", 8 * BLOCK, ("i1",), None) as call:
        yield call


def write(http, key: int, instance_id: str = "i1") -> str:
    start = http("startWriteCache", {"instance_id": instance_id, "block_keys": [key]})
    code = start["header"]["status"]["code"]
    if code == "OK":
        fin = http(
            "finishWriteCache",
            {
                "instance_id": instance_id,
                "write_session_id": start["write_session_id"],
                "success_blocks": {"offset": len(start["locations"])},
            },
        )
        assert fin["header"]["status"]["code"] == "OK", fin
    return code


def status(http, key: int) -> str:
    return json.loads(http("getCacheMeta", {"instance_id": "i1", "block_keys": [key]})["metas"][0])["status"]


def live_usage(runtime) -> tuple[int, int]:
    """(bytes, keys) the group's quota counts: what exists, less what is on its way out."""
    usage = runtime.index.group_usage(["gc"])[0].live()
    return usage.bytes, usage.keys


def test_a_full_group_makes_room_on_the_write_path(runtime, http, clock):
    for key in range(1, 9):
        clock.advance(1)
        assert write(http, key) == "OK"
    clock.advance(1)
    http("getCacheLocation", {"instance_id": "i1", "query_type": "QT_PREFIX_MATCH", "block_keys": [1]})
    clock.advance(1)
    assert write(http, 9) == "OK"  # the least recently used block made room at once
    assert status(http, 2) == "CLS_DELETING"  # queued: the write did not wait for its deletion
    assert status(http, 1) == "CLS_SERVING"  # read since it was written
    assert live_usage(runtime) == (8 * BLOCK, 8)
    assert runtime.reclaim_job.run()["handed_over"] == 1  # the next round hands it to the deleter
    assert status(http, 2) == "CLS_NOT_FOUND"
    (event,) = [json.loads(line) for line in open(runtime.settings.event_log_path) if '"CacheReclaimSubmit"' in line]
    assert event["source"] == "i1" and event["block_keys"] == [2] and event["delay_us"] == 0


def test_a_write_nothing_can_make_room_for_is_refused_and_wakes_the_reclaimer(runtime, http, valkey, clock):
    starts = [http("startWriteCache", {"instance_id": "i1", "block_keys": [key]}) for key in range(1, 9)]
    assert [s["header"]["status"]["code"] for s in starts] == ["OK"] * 8  # all WRITING: nothing to evict
    assert write(http, 9) == "REACH_MAX_ENTITY_CAPACITY"
    assert valkey.smembers(WAKE_KEY) == {b"gc"}
    assert live_usage(runtime) == (8 * BLOCK, 8)
    for start in starts:
        http(
            "finishWriteCache",
            {"instance_id": "i1", "write_session_id": start["write_session_id"], "success_blocks": {"offset": 1}},
        )
    report = runtime.reclaim_job.run()
    assert report["groups"][0]["reason"] == "woken" and report["victims"] == 1  # headroom under pressure
    assert write(http, 9) == "OK"


def test_writes_from_many_threads_keep_a_full_group_within_its_quota(runtime, http, clock):
    """Eight writers fill a 64-block group and keep writing: every write is taken (at most
    eight blocks are in flight, the rest SERVING and evictable), and the live usage never
    passes the quota by more than the writes in flight (one request's block each). The
    writers call the data plane itself: Chalice's test client patches the process
    environment per request, which is not safe across threads."""
    from concurrent.futures import ThreadPoolExecutor

    from chalicelib.protocol.errors import CapacityExceededError
    from chalicelib.protocol.models import BlockMask, FinishWriteCacheRequest, StartWriteCacheRequest

    runtime.control.create_group(
        InstanceGroup.model_validate(
            {"name": "g64", "storage_candidates": ["nfs_01"], "quota": {"capacity": 64 * BLOCK}}
        )
    )
    resp = http(
        "registerInstance",
        {
            "instance_group": "g64",
            "instance_id": "i64",
            "block_size": 4,
            "location_spec_infos": SPECS,
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )
    assert resp["header"]["status"]["code"] == "OK", resp
    peaks = []

    def write_direct(key: int) -> str:
        try:
            start = runtime.cache.start_write_cache(StartWriteCacheRequest(instance_id="i64", block_keys=[key]))
        except CapacityExceededError as refusal:
            return f"refused: {refusal}"
        runtime.cache.finish_write_cache(
            FinishWriteCacheRequest(
                instance_id="i64",
                write_session_id=start.write_session_id,
                success_blocks=BlockMask(offset=len(start.locations)),
            )
        )
        return "OK"

    def writer(first: int) -> list[str]:
        codes = []
        for key in range(first, first + 40):
            codes.append(write_direct(key))
            peaks.append(runtime.index.group_usage(["g64"])[0].live().bytes)
        return codes

    with ThreadPoolExecutor(8) as pool:
        codes = [c for codes in pool.map(writer, range(1000, 9000, 1000)) for c in codes]
    assert codes == ["OK"] * 320
    assert max(peaks) <= 64 * BLOCK + 8 * BLOCK
    assert runtime.index.group_usage(["g64"])[0].live().bytes <= 64 * BLOCK


def test_no_round_while_another_node_holds_the_lease(runtime, http, valkey, clock):
    other = Lease(
        valkey,
        prefix=runtime.settings.key_prefix,
        node_id="other-node",
        ttl_ms=runtime.settings.lease_ttl_ms,
        clock=clock,
    )
    assert other.try_acquire()
    runtime.reclaim_job.wake("gc")
    report = runtime.reclaim_job.run()
    assert report["skipped"] and report["groups"] == []
    assert valkey.smembers(WAKE_KEY) == {b"gc"}  # left for the lease holder
    other.release()
    assert runtime.reclaim_job.run()["groups"][0]["reason"] == "woken"
    assert runtime.lease.holder() == "this-node"


def test_request_reclaim_is_debounced_and_never_raises(runtime, valkey, clock, monkeypatch):
    runtime.reclaim_job.wake("gc")
    valkey.delete(WAKE_KEY)
    runtime.reclaim_job.wake("gc")  # within the debounce window: no second SADD
    assert valkey.smembers(WAKE_KEY) == set()
    clock.advance(1)
    runtime.reclaim_job.wake("gc")
    assert valkey.smembers(WAKE_KEY) == {b"gc"}

    def down(group):
        raise redis.ConnectionError("Valkey is down")

    monkeypatch.setattr(runtime.index, "request_reclaim", down)
    clock.advance(1)
    runtime.reclaim_job.wake("gc")  # logged, not raised
