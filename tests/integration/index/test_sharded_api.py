"""A group's ``instance_shards`` through the API: registration claims the shards, the meta
methods answer as for one shard, removeInstance purges every shard, bad values are refused
naming the field (docs/instance-sharding.md). One Valkey node holds every shard here; the
three-master cluster is test_sharded_instance.py's."""

import json
import random

import pytest

from chalicelib.index.sharding import shard_of
from chalicelib.index.types import MODE_RAW
from chalicelib.protocol.models import (
    FinishWriteCacheRequest,
    GetCacheLocationRequest,
    InstanceGroup,
    RegisterInstanceRequest,
    RemoveInstanceRequest,
    StartWriteCacheRequest,
    StorageConfig,
    TrimCacheRequest,
)
from tests.helpers import SPECS
from tests.integration.control.harness import call, code, group_json, message, nfs


@pytest.fixture
def sharded_group(runtime, tmp_path):
    runtime.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_01", "nfs": {"root_path": str(tmp_path / "nfs"), "key_count_per_file": 4}}
        )
    )
    return runtime.control.create_group(
        InstanceGroup.model_validate(
            {"name": "g1", "storage_candidates": ["nfs_01"], "quota": {"capacity": 1 << 30}, "instance_shards": 3}
        )
    )


def register(rt, instance_id):
    rt.meta_service.register_instance(
        RegisterInstanceRequest.model_validate(
            {
                "instance_group": "g1",
                "instance_id": instance_id,
                "block_size": 4,
                "location_spec_infos": SPECS,
                "model_deployment": {"model_name": "m", "dtype": "fp16"},
            }
        )
    )


def write(rt, instance_id, keys):
    start = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id=instance_id, block_keys=keys))
    rt.cache.finish_write_cache(
        FinishWriteCacheRequest.model_validate(
            {
                "instance_id": instance_id,
                "write_session_id": start.write_session_id,
                "success_blocks": {"offset": len(start.locations)},
            }
        )
    )
    return start


def test_a_sharded_instance_serves_like_one_shard_and_is_removed_from_every_shard(runtime, sharded_group):
    rt = runtime
    register(rt, "i1")
    layout = rt.contexts("i1").layout
    assert layout.shard_count == 3
    rng = random.Random(1)
    keys = [rng.getrandbits(62) for _ in range(40)]
    assert {shard_of(k, 3) for k in keys} == {0, 1, 2}
    start = write(rt, "i1", keys)
    assert len({json.dumps(loc, sort_keys=True) for loc in start.locations}) == 40  # ids unique across shards
    hits = rt.cache.get_cache_location(
        GetCacheLocationRequest.model_validate(
            {
                "instance_id": "i1",
                "block_keys": keys + [rng.getrandbits(62)] + keys[:3],
                "query_type": "QT_PREFIX_MATCH",
            }
        )
    )
    assert len(hits.locations) == 40
    assert all(rt.index.occupied_count(shard) > 0 for shard in layout.shards)

    rt.group_admin.remove_instance(RemoveInstanceRequest(instance_id="i1"))

    assert rt.control.get_instance("i1") is None
    for shard in layout.shards:
        assert rt.valkey.exists(shard.key("u"), shard.key("sd"), shard.occupied) == 0
    assert rt.index.group_usage(["g1"])[0].bytes == 0
    register(rt, "i1")  # the id is free again, its blocks gone from every shard
    assert rt.index.read_raw(rt.contexts("i1").layout, keys, MODE_RAW) == [None] * 40


def test_data_a_metadata_trim_forgot_is_deleted_from_every_shard_with_the_instance(runtime, sharded_group, tmp_path):
    """Issue #28 item 6 across shards: each shard keeps its forgotten locations, and the
    removal deletes their files and releases their bytes in every shard."""
    from pathlib import Path

    rt = runtime
    register(rt, "i1")
    layout = rt.contexts("i1").layout
    rng = random.Random(2)
    keys = [rng.getrandbits(62) for _ in range(24)]
    for location in write(rt, "i1", keys).locations:
        for spec in location["location_specs"]:
            path = Path(spec["uri"].split("?")[0][len("file://nfs_01") :])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")
    rt.cache.trim_cache(TrimCacheRequest.model_validate({"instance_id": "i1", "strategy": "TS_REMOVE_ALL_META"}))
    forgotten = [rt.valkey.scard(shard.key("fg")) for shard in layout.shards]
    assert sum(forgotten) == 24 and all(forgotten)

    rt.group_admin.remove_instance(RemoveInstanceRequest(instance_id="i1"))

    assert [p for p in (tmp_path / "nfs").rglob("*") if p.is_file()] == []
    assert rt.index.group_usage(["g1"])[0].bytes == 0
    assert sum(rt.valkey.scard(shard.key("fg")) for shard in layout.shards) == 0


def test_an_instance_registered_before_the_group_shards_keeps_its_one_shard(runtime, sharded_group):
    rt = runtime
    group = sharded_group.model_copy(update={"instance_shards": 0, "version": 0})
    rt.control.update_group(group, 1)
    rt.config.invalidate()
    register(rt, "old")
    write(rt, "old", [1, 2, 3])
    rt.control.update_group(group.model_copy(update={"instance_shards": 2}), 2)
    rt.config.invalidate()
    rt.contexts.forget("old")
    assert rt.contexts("old").layout.shard_count == 1  # its key space keeps the layout it has
    assert (
        len(
            rt.cache.get_cache_location(
                GetCacheLocationRequest.model_validate(
                    {"instance_id": "old", "block_keys": [1, 2, 3], "query_type": "QT_PREFIX_MATCH"}
                )
            ).locations
        )
        == 3
    )


@pytest.mark.parametrize("shards", [-1, 17])
def test_a_bad_instance_shards_is_refused_naming_the_field(client, control, shards):
    control.add_storage(StorageConfig.model_validate(nfs("nfs1")))
    data = call(client, "createInstanceGroup", {"instance_group": group_json("g1", instance_shards=shards)})
    assert code(data) == "INVALID_ARGUMENT" and "instance_group.instance_shards" in message(data)
    assert code(call(client, "getInstanceGroup", {"name": "g1"})) != "OK"
    assert code(call(client, "createInstanceGroup", {"instance_group": group_json("g1", instance_shards=3)})) == "OK"
    data = call(
        client,
        "updateInstanceGroup",
        {"instance_group": group_json("g1", instance_shards=shards), "current_version": 1},
    )
    assert code(data) == "INVALID_ARGUMENT" and "instance_group.instance_shards" in message(data)
    stored = call(client, "getInstanceGroup", {"name": "g1"})["instance_group"]
    assert stored["instance_shards"] == 3 and int(stored["version"]) == 1
