"""Per-instance quotas (``instance_quotas``) and tuning settings of a group over HTTP: kept
and rendered, bad values refused naming the field with nothing changed, and enforced
exactly by startWriteCache, the write path making room in the instance itself."""

from __future__ import annotations

import pytest

from tests.integration.control.harness import add_storages, call, code, group_json, message, nfs

BLOCK = 1024


def get(client) -> dict:
    return call(client, "getInstanceGroup", {"name": "g1"})["instance_group"]


def create(client, **extra) -> None:
    assert code(call(client, "createInstanceGroup", {"instance_group": group_json("g1", **extra)})) == "OK"


def test_the_fields_are_stored_and_rendered(client, control):
    add_storages(control)
    create(client, quota={"capacity": 1000}, instance_quotas={"i1": 600}, tuning={"enabled": True})
    group = get(client)
    assert group["instance_quotas"] == {"i1": "600"}
    assert group["tuning"] == {"enabled": True, "max_shift": 0.2, "min_gain": 0.0, "window_seconds": "3600"}
    update = call(
        client,
        "updateInstanceGroup",
        {
            "current_version": 1,
            "instance_group": group_json("g1", quota={"capacity": 1000}, instance_quotas={"i1": 300, "i2": 700}),
        },
    )
    assert code(update) == "OK" and get(client)["instance_quotas"] == {"i1": "300", "i2": "700"}


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"instance_quotas": {"i1": 0}}, "instance_group.instance_quotas.i1"),
        ({"instance_quotas": {"i1": 800, "i2": 300}}, "instance_group.instance_quotas"),
        ({"instance_quotas": {"i1": "many"}}, "instance_quotas"),
        ({"instance_quotas": ["i1"]}, "instance_quotas"),
        ({"tuning": {"max_shift": 2}}, "instance_group.tuning.max_shift"),
        ({"tuning": {"enabled": "yes"}}, "tuning.enabled"),
        ({"tuning": {"enabled": True}, "quota": {"capacity": 0}}, "instance_group.tuning.enabled"),
    ],
)
def test_bad_values_are_refused_naming_the_field_and_nothing_changes(client, fields, named, control):
    add_storages(control)
    create(client, quota={"capacity": 1000}, instance_quotas={"i1": 500})
    before = get(client)
    body = {"current_version": 1, "instance_group": group_json("g1", **{"quota": {"capacity": 1000}, **fields})}
    data = call(client, "updateInstanceGroup", body)
    assert code(data) == "INVALID_ARGUMENT" and named in message(data), message(data)
    assert get(client) == before
    created = call(
        client, "createInstanceGroup", {"instance_group": group_json("g2", **{"quota": {"capacity": 1000}, **fields})}
    )
    assert code(created) == "INVALID_ARGUMENT" and named in message(created)
    assert code(call(client, "getInstanceGroup", {"name": "g2"})) == "INVALID_ARGUMENT"  # not created


def register(client, instance_id: str) -> None:
    data = call(
        client,
        "registerInstance",
        {
            "instance_group": "g1",
            "instance_id": instance_id,
            "block_size": 16,
            "location_spec_infos": [{"name": "tp0", "size": BLOCK}],
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )
    assert code(data) == "OK", data


def write(client, instance_id: str, keys: list[int]) -> dict:
    start = call(client, "startWriteCache", {"instance_id": instance_id, "block_keys": keys})
    if code(start) == "OK" and start["locations"]:
        fin = call(
            client,
            "finishWriteCache",
            {
                "instance_id": instance_id,
                "write_session_id": start["write_session_id"],
                "success_blocks": {"offset": len(start["locations"])},
            },
        )
        assert code(fin) == "OK", fin
    return start


def live_bytes(runtime, instance_id: str) -> int:
    (usage,) = runtime.index.usage([runtime.contexts(instance_id).layout])
    return usage.live().bytes


def test_an_instance_is_held_to_its_own_quota_on_the_write_path(client, runtime, tmp_path):
    assert code(call(client, "addStorage", {"storage": nfs("nfs1", str(tmp_path))})) == "OK"
    # reclaim off (used_percentage above 1): a refusal stands
    strategy = {"reclaim_strategy": {"trigger_strategy": {"used_percentage": 3.2}}}
    create(client, quota={"capacity": 100 * BLOCK}, instance_quotas={"i1": 8 * BLOCK}, cache_config=strategy)
    register(client, "i1")
    register(client, "i2")
    assert code(write(client, "i1", list(range(1, 9)))) == "OK"  # exactly its quota
    refused = write(client, "i1", [100])
    assert code(refused) == "REACH_MAX_ENTITY_CAPACITY" and "instance_quotas" in message(refused)
    assert code(write(client, "i2", list(range(1, 21)))) == "OK"  # no quota of its own: the group's
    assert live_bytes(runtime, "i1") == 8 * BLOCK

    # reclaim on: the write path evicts in i1 (never in i2) and the write goes through
    update = call(
        client,
        "updateInstanceGroup",
        {
            "current_version": 1,
            "instance_group": group_json("g1", quota={"capacity": 100 * BLOCK}, instance_quotas={"i1": 8 * BLOCK}),
        },
    )
    assert code(update) == "OK"
    runtime.config.invalidate()
    assert code(write(client, "i1", [100, 101, 102])) == "OK"
    assert live_bytes(runtime, "i1") <= 8 * BLOCK and live_bytes(runtime, "i2") == 20 * BLOCK


def test_the_reclaimer_trims_an_instance_over_its_own_watermark_while_the_group_is_under(client, runtime, tmp_path):
    assert code(call(client, "addStorage", {"storage": nfs("nfs1", str(tmp_path))})) == "OK"
    strategy = {"reclaim_strategy": {"trigger_strategy": {"used_percentage": 0.5}, "reclaim_step_percentage": 100}}
    create(client, quota={"capacity": 1000 * BLOCK}, instance_quotas={"i1": 10 * BLOCK}, cache_config=strategy)
    register(client, "i1")
    register(client, "i2")
    for instance in ("i1", "i2"):
        assert code(write(client, instance, list(range(1, 9)))) == "OK"  # 8 blocks each: i1 under its hard limit
    runtime.reclaim_job.run()
    assert live_bytes(runtime, "i1") <= 5 * BLOCK  # its own trigger: 10 blocks x 0.5
    assert live_bytes(runtime, "i2") == 8 * BLOCK  # the group (1000 blocks) is far under its watermark
