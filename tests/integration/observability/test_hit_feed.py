"""The hit feed on the read and write path (observability.hit_feed): sampled keys go to the
instance's stream in the round trip the call makes anyway; a call without one sends
nothing, its blocks asked ride on the next entry."""

from __future__ import annotations

import functools

import pytest

from chalicelib.observability.hit_feed import HASH_RANGE, PREFIX, READ, WRITE, FeedEntry, key_hash
from chalicelib.protocol.models import (
    GetCacheLocationRequest,
    InstanceGroup,
    RegisterInstanceRequest,
    StartWriteCacheRequest,
    StorageConfig,
)
from tests.helpers import api_caller


@pytest.fixture
def runtime_settings():
    return {"key_prefix": "feedtest", "node_id": "node-a"}


@pytest.fixture
def instance(runtime, tmp_path):
    runtime.control.add_storage(
        StorageConfig.model_validate({"global_unique_name": "nfs_01", "nfs": {"root_path": str(tmp_path)}})
    )
    runtime.control.create_group(InstanceGroup.model_validate({"name": "g", "storage_candidates": ["nfs_01"]}))
    runtime.meta_service.register_instance(
        RegisterInstanceRequest.model_validate(
            {
                "instance_group": "g",
                "instance_id": "i",
                "block_size": 16,
                "location_spec_infos": [{"name": "tp0", "size": 1024}],
                "model_deployment": {"model_name": "m", "dtype": "fp16"},
            }
        )
    )
    return runtime


def give_quota(runtime, capacity: int) -> None:
    group = {"name": "g", "storage_candidates": ["nfs_01"], "quota": {"capacity": capacity}}
    runtime.control.update_group(InstanceGroup.model_validate(group), runtime.control.get_group("g").version)


def entries(runtime) -> list[FeedEntry]:
    raw = runtime.valkey.xrange(runtime.hit_curve_store.stream("i"))
    return [FeedEntry.from_fields(fields) for _, fields in raw]


def read(runtime, keys):
    return runtime.cache.get_cache_location(
        GetCacheLocationRequest(instance_id="i", block_keys=keys, query_type="QT_PREFIX_MATCH")
    )


def test_sampled_keys_ride_on_the_calls_round_trips_and_unsampled_reads_on_the_next_entry(instance, round_trips):
    runtime = instance
    threshold = HASH_RANGE // 4
    runtime.hit_feed.threshold = threshold
    keys = list(range(1, 41))
    sampled = [k for k in keys if key_hash(k) < threshold]
    unsampled = [k for k in keys if key_hash(k) >= threshold][:3]
    assert sampled and unsampled

    read(runtime, unsampled)  # warm: the container's config and the script are loaded
    before = round_trips()
    read(runtime, unsampled)  # nothing sampled: the read script alone
    assert round_trips() - before == 1 and entries(runtime) == []

    session = runtime.cache.start_write_cache(StartWriteCacheRequest(instance_id="i", block_keys=keys))
    assert session.write_session_id
    read(runtime, keys)
    got = entries(runtime)
    assert [(e.op, e.query, e.keys) for e in got] == [(WRITE, PREFIX, sampled), (READ, PREFIX, sampled)]
    assert got[1].asked == 2 * len(unsampled) + len(keys)  # the unsampled reads' blocks came along
    assert got[1].time_ms == int(runtime.clock.now() * 1000)

    before = round_trips()
    read(runtime, keys)  # a sampled read: EVALSHA and XADD in one pipeline
    assert round_trips() - before == 1 and len(entries(runtime)) == 3


def test_the_feed_off_sends_nothing(instance):
    instance.hit_feed.threshold = 0
    instance.cache.start_write_cache(StartWriteCacheRequest(instance_id="i", block_keys=[1, 2, 3]))
    read(instance, [1, 2, 3])
    assert entries(instance) == []


def test_get_group_hit_curve_before_any_traffic_and_for_bad_names(instance, client):
    call = functools.partial(api_caller(client), "getGroupHitCurve")
    empty = call({"name": "g"})
    assert empty["header"]["status"]["code"] == "OK" and empty.get("points", []) == []
    assert instance.hit_curves.run() == {"groups": 0, "entries": 0}  # nothing fed: one round trip, nothing saved
    missing = call({})["header"]["status"]
    assert missing["code"] == "INVALID_ARGUMENT" and "'name'" in missing["message"]
    unknown = call({"name": "nosuch"})["header"]["status"]  # as getInstanceGroup answers
    assert unknown["code"] == "INVALID_ARGUMENT" and "nosuch" in unknown["message"]


def test_a_run_drops_the_curve_and_stream_of_an_instance_no_longer_registered(instance):
    from chalicelib.optimizer.live import LiveCurve

    runtime, store = instance, instance.hit_curve_store
    runtime.hit_feed.threshold = HASH_RANGE
    runtime.cache.start_write_cache(StartWriteCacheRequest(instance_id="i", block_keys=[1, 2]))
    read(runtime, [1, 2])
    store.save(
        "g", {"instances": {"ghost": LiveCurve(threshold=HASH_RANGE).to_dict()}, "through_ms": 0, "epoch": 0}, {}
    )
    runtime.valkey.xadd(store.stream("ghost"), FeedEntry(READ, PREFIX, [5], 1).fields())
    assert runtime.hit_curves.run() == {"groups": 1, "entries": 2}
    assert list(store.load("g")["instances"]) == ["i"]
    assert not runtime.valkey.exists(store.stream("ghost")) and runtime.valkey.xlen(store.stream("i")) == 0


def test_removing_an_instance_deletes_its_feed_stream(instance):
    from chalicelib.protocol.models import RemoveInstanceRequest

    runtime, store = instance, instance.hit_curve_store
    runtime.hit_feed.threshold = HASH_RANGE
    runtime.cache.start_write_cache(StartWriteCacheRequest(instance_id="i", block_keys=[1, 2]))
    read(runtime, [1, 2])
    assert runtime.valkey.xlen(store.stream("i")) == 2
    runtime.group_admin.remove_instance(RemoveInstanceRequest(instance_id="i"))
    assert runtime.control.get_instance("i") is None
    assert list(runtime.valkey.scan_iter(match="*:hf")) == []


def test_a_small_workload_gives_a_curve_marked_not_confident_and_no_hit_ratio_gauge(instance, client):
    import json

    from chalicelib.observability.hit_feed import threshold_of
    from chalicelib.protocol.models import FinishWriteCacheRequest

    runtime = instance
    runtime.hit_feed.threshold = threshold_of(1 / 8)  # the default rate
    give_quota(runtime, 1 << 20)
    keys = list(range(1, 65))
    start = runtime.cache.start_write_cache(StartWriteCacheRequest(instance_id="i", block_keys=keys[:3]))
    runtime.cache.finish_write_cache(
        FinishWriteCacheRequest(instance_id="i", write_session_id=start.write_session_id, success_blocks={"offset": 3})
    )
    for _ in range(5):
        read(runtime, keys)
    runtime.hit_curves.run()
    resp = client.http.post(
        "/api/getGroupHitCurve", body=json.dumps({"name": "g"}), headers={"Content-Type": "application/json"}
    )
    curve = json.loads(resp.body)
    tags = {"instance_id": "i"}
    served = runtime.metrics.value("manager.get_cache_location_hit_block_counter", tags) / runtime.metrics.value(
        "manager.get_cache_location_query_block_counter", tags
    )
    assert served == pytest.approx(15 / 320)
    assert curve["hit_ratio_at_quota"] > served + 0.3  # 0.375: the sample's gap credited as hits
    (only,) = curve["instances"]
    assert int(only["kept_keys"]) < 16 and only["confident"] is False
    assert curve["confident"] is False and int(curve["min_kept_keys"]) == 512
    assert runtime.metrics.value("kvcm.hit_curve.hit_ratio", {"instance_group": "g", "quota": "x1"}) is None
    assert runtime.metrics.value("kvcm.hit_curve.confident", {"instance_group": "g"}) == 0


def test_reset_group_hit_curve_starts_the_curve_over_and_a_run_loaded_before_saves_nothing(instance, client):
    import json

    def call(method, body):
        resp = client.http.post(f"/api/{method}", body=json.dumps(body), headers={"Content-Type": "application/json"})
        return json.loads(resp.body)

    runtime, store = instance, instance.hit_curve_store
    runtime.hit_feed.threshold = HASH_RANGE
    give_quota(runtime, 4 * 1024)  # an instance keeps 3 blocks of 1 KiB (watermark 0.9)
    runtime.cache.start_write_cache(StartWriteCacheRequest(instance_id="i", block_keys=[1, 2, 3]))
    read(runtime, [1, 2, 3])
    assert runtime.hit_curves.run() == {"groups": 1, "entries": 2}
    (before,) = call("getGroupHitCurve", {"name": "g"})["instances"]
    assert int(before["read_blocks"]) == 3 and int(before["unique_keys"]) == 3
    assert (int(before["capacity_blocks"]), int(before["peak_unique_keys"]), int(before["eviction_count"])) == (3, 3, 0)

    read(runtime, [1, 2, 3])  # an entry not read yet when the reset comes
    loaded = store.load("g")  # a run that loaded the state before the reset...
    assert call("resetGroupHitCurve", {"name": "g"})["header"]["status"]["code"] == "OK"
    assert not store.save("g", loaded, {"stale": True})  # ...saves nothing after it
    after = call("getGroupHitCurve", {"name": "g"})
    assert after["header"]["status"]["code"] == "OK" and after.get("points", []) == [] and not after.get("instances")
    assert runtime.valkey.exists(store.stream("i")) == 0
    assert runtime.metrics.value("kvcm.hit_curve.confident", {"instance_group": "g"}) == 0

    read(runtime, [1, 2])  # the traffic after the reset is the new curve's
    assert runtime.hit_curves.run() == {"groups": 1, "entries": 1}
    (fresh,) = call("getGroupHitCurve", {"name": "g"})["instances"]
    assert int(fresh["read_blocks"]) == 2 and int(fresh["reads"]) == 1
