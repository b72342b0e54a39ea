"""The entry points on a full runtime (real Valkey, moto DynamoDB, HTTP meta API):
a refused write wakes the reclaimer, the next round makes room, the lease is honoured."""
from __future__ import annotations

import json

import pytest
import redis
from chalice.test import Client

from tests.conftest import build_runtime
from chalicelib.capacity import reclaim_handler, request_reclaim
from chalicelib.index.lease import Lease
from chalicelib.protocol.models import InstanceGroup, StorageConfig
from chalicelib.runtime import set_runtime

SPECS = [{"name": "tp0", "size": 1024}, {"name": "tp1", "size": 1024}]
BLOCK = 2048
WAKE_KEY = "{kvcm:reclaim}:wake"


@pytest.fixture
def runtime(valkey, valkey_url, aws, clock, tmp_path):
    yield build_runtime(valkey, valkey_url, clock, node_id="this-node", event_log_path=str(tmp_path / "events.log"))
    set_runtime(None)


@pytest.fixture
def http(runtime, tmp_path):
    import app

    runtime.control.add_storage(StorageConfig.model_validate(
        {"global_unique_name": "nfs_01", "nfs": {"root_path": str(tmp_path / "nfs"), "key_count_per_file": 1}}))
    # full at 8 blocks, and a watermark of 100 %: only a refused write makes room
    runtime.control.create_group(InstanceGroup.model_validate({
        "name": "gc", "storage_candidates": ["nfs_01"], "quota": {"capacity": 8 * BLOCK},
        "cache_config": {"reclaim_strategy": {"trigger_strategy": {"used_percentage": 1.0}}}}))
    with Client(app.app) as client:
        def call(method: str, body: dict) -> dict:
            resp = client.http.post(f"/api/{method}", body=json.dumps(body),
                                    headers={"Content-Type": "application/json"})
            return json.loads(resp.body)

        resp = call("registerInstance", {"instance_group": "gc", "instance_id": "i1", "block_size": 4,
                                         "location_spec_infos": SPECS,
                                         "model_deployment": {"model_name": "m", "dtype": "fp16"}})
        assert resp["header"]["status"]["code"] == "OK", resp
        yield call


def write(http, key: int) -> str:
    start = http("startWriteCache", {"instance_id": "i1", "block_keys": [key]})
    code = start["header"]["status"]["code"]
    if code == "OK":
        fin = http("finishWriteCache", {"instance_id": "i1", "write_session_id": start["write_session_id"],
                                        "success_blocks": {"offset": len(start["locations"])}})
        assert fin["header"]["status"]["code"] == "OK", fin
    return code


def status(http, key: int) -> str:
    return json.loads(http("getCacheMeta", {"instance_id": "i1", "block_keys": [key]})["metas"][0])["status"]


def test_a_refused_write_wakes_the_reclaimer_and_the_next_round_makes_room(runtime, http, clock):
    for key in range(1, 9):
        clock.advance(1)
        assert write(http, key) == "OK"
    assert write(http, 9) == "REACH_MAX_ENTITY_CAPACITY"  # the refusal itself wakes the reclaimer
    report = reclaim_handler(runtime)
    assert report["groups"][0]["reason"] == "woken"
    assert report["victims"] == 1 and report["bytes"] == BLOCK
    assert status(http, 1) == "CLS_NOT_FOUND"  # the least recently used block went
    assert write(http, 9) == "OK"
    (event,) = [json.loads(line) for line in open(runtime.settings.event_log_path)
                if '"CacheReclaimSubmit"' in line]
    assert event["source"] == "i1" and event["block_keys"] == [1] and event["delay_us"] == 0
    # the next round checks again whether the group is still over, then it waits a period
    again = reclaim_handler(runtime)
    assert again["groups"][0]["reason"] == "over" and again["victims"] == 0
    assert reclaim_handler(runtime)["groups"] == []


def test_no_round_while_another_node_holds_the_lease(runtime, http, valkey, clock):
    other = Lease(valkey, prefix=runtime.settings.key_prefix, node_id="other-node",
                  ttl_ms=runtime.settings.lease_ttl_ms, clock=clock)
    assert other.try_acquire()
    request_reclaim(runtime, "gc")
    report = reclaim_handler(runtime)
    assert report["skipped"] and report["groups"] == []
    assert valkey.smembers(WAKE_KEY) == {b"gc"}  # left for the lease holder
    other.release()
    assert reclaim_handler(runtime)["groups"][0]["reason"] == "woken"
    assert runtime.lease.holder() == "this-node"


def test_request_reclaim_is_debounced_and_never_raises(runtime, valkey, clock, monkeypatch):
    request_reclaim(runtime, "gc")
    valkey.delete(WAKE_KEY)
    request_reclaim(runtime, "gc")  # within the debounce window: no second SADD
    assert valkey.smembers(WAKE_KEY) == set()
    clock.advance(1)
    request_reclaim(runtime, "gc")
    assert valkey.smembers(WAKE_KEY) == {b"gc"}

    def down(group):
        raise redis.ConnectionError("Valkey is down")

    monkeypatch.setattr(runtime.index, "request_reclaim", down)
    clock.advance(1)
    request_reclaim(runtime, "gc")  # logged, not raised
