"""AdminService instance group methods over HTTP."""

import pytest

from chalicelib.runtime import get_runtime
from tests.integration.control.harness import (
    add_storages,
    call,
    code,
    group_json,
    message,
    nfs,
    register_request,
    snapshot,
)


def get(client, name="g1") -> dict:
    return call(client, "getInstanceGroup", {"name": name})


def test_create_get_list_with_defaults(client, control):
    add_storages(control, "nfs1", "later")
    body = {
        "instanceGroup": {
            "name": "g1",
            "storageCandidates": ["nfs1", "later"],
            "maxInstanceCount": "2",
            "quota": {"capacity": "1073741824", "quotaConfig": [{"storageType": "ST_NFS", "capacity": 10}]},
        }
    }
    assert code(call(client, "createInstanceGroup", body)) == "OK"
    group = get(client)["instance_group"]
    assert group["version"] == "1" and group["max_instance_count"] == "2"
    assert group["quota"] == {"capacity": "1073741824", "quota_config": [{"storage_type": "ST_NFS", "capacity": "10"}]}
    reclaim = group["cache_config"]["reclaim_strategy"]
    assert (
        reclaim["reclaim_policy"],
        reclaim["trigger_strategy"]["used_percentage"],
        reclaim["trigger_period_seconds"],
    ) == ("POLICY_LRU", 0.9, 10)
    call(client, "createInstanceGroup", {"instance_group": group_json("g0")})
    assert [g["name"] for g in call(client, "listInstanceGroup")["instance_group"]] == ["g0", "g1"]


def test_duplicate_group(client, control):
    add_storages(control, "a")  # not "b": a duplicate name is what the second create is told
    call(client, "createInstanceGroup", {"instance_group": group_json("g1", "a")})
    data = call(client, "createInstanceGroup", {"instance_group": group_json("g1", "b")})
    assert code(data) == "DUPLICATE_ENTITY"
    assert get(client)["instance_group"]["storage_candidates"] == ["a"]


def test_unknown_group_is_named(client):
    for method in ("getInstanceGroup", "removeInstanceGroup"):
        data = call(client, method, {"name": "nope"})
        assert (code(data), message(data)) == ("INVALID_ARGUMENT", "instance group 'nope' does not exist")
    data = call(client, "updateInstanceGroup", {"instance_group": group_json("nope"), "current_version": 1})
    assert (code(data), message(data)) == ("INVALID_ARGUMENT", "instance group 'nope' does not exist")


def test_update_is_optimistic(client, control):
    add_storages(control)
    call(client, "createInstanceGroup", {"instance_group": group_json("g1")})
    ok = call(
        client, "updateInstanceGroup", {"instance_group": group_json("g1", user_data="v2"), "current_version": "1"}
    )
    assert code(ok) == "OK"
    stale = call(
        client, "updateInstanceGroup", {"instance_group": group_json("g1", user_data="late"), "current_version": 1}
    )
    assert code(stale) == "INVALID_ARGUMENT" and "version 2" in message(stale)
    same = call(client, "updateInstanceGroup", {"instance_group": group_json("g1", version=2), "current_version": 2})
    assert code(same) == "INVALID_ARGUMENT" and "instance_group.version" in message(same)
    group = get(client)["instance_group"]
    assert (group["version"], group["user_data"]) == ("2", "v2")


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_updates_over_http_exactly_one_wins(client, round_, control):
    add_storages(control)
    import threading

    call(client, "createInstanceGroup", {"instance_group": group_json("g1")})
    codes, barrier = [], threading.Barrier(2)

    def update(tag):
        barrier.wait()
        codes.append(
            code(
                call(
                    client,
                    "updateInstanceGroup",
                    {"instance_group": group_json("g1", user_data=tag), "current_version": 1},
                )
            )
        )

    threads = [threading.Thread(target=update, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == ["INVALID_ARGUMENT", "OK"]
    assert get(client)["instance_group"]["version"] == "2"


def test_group_with_members_cannot_be_removed(client, control):
    add_storages(control)
    call(client, "createInstanceGroup", {"instance_group": group_json("g1")})
    control.register_instance(register_request("i1"))
    data = call(client, "removeInstanceGroup", {"name": "g1"})
    assert code(data) == "INVALID_ARGUMENT" and "1 registered instance" in message(data)
    assert code(get(client)) == "OK"
    call(client, "removeInstance", {"instance_id": "i1"})
    runtime = get_runtime()
    runtime.valkey.hset(runtime.index.group_usage_key("g1"), "bytes", 7)  # left by a drifted counter
    assert code(call(client, "removeInstanceGroup", {"name": "g1"})) == "OK"
    assert call(client, "listInstanceGroup")["instance_group"] == []
    assert runtime.valkey.exists(runtime.index.group_usage_key("g1")) == 0  # its counters went with it


def test_a_group_naming_a_storage_that_does_not_exist_is_refused_and_changes_nothing(client):
    """As registerInstance's storages: a candidate that is not a storage is INVALID_ARGUMENT
    naming it, on create and on update (every later write of the group would fail)."""
    call(client, "addStorage", {"storage": nfs("nfs_01")})
    before = snapshot(get_runtime())
    data = call(client, "createInstanceGroup", {"instance_group": group_json("gx", "nfs_01", "nosuch")})
    assert code(data) == "INVALID_ARGUMENT"
    assert message(data) == (
        "field 'instance_group.storage_candidates[1]' names storage 'nosuch', which does not exist (addStorage first)"
    )
    assert snapshot(get_runtime()) == before
    assert code(call(client, "createInstanceGroup", {"instance_group": group_json("gx", "nfs_01")})) == "OK"
    before = snapshot(get_runtime())
    data = call(
        client, "updateInstanceGroup", {"instance_group": group_json("gx", "nosuch", "nfs_01"), "current_version": 1}
    )
    assert code(data) == "INVALID_ARGUMENT" and "'instance_group.storage_candidates[0]' names storage 'nosuch'" in (
        message(data)
    )
    assert snapshot(get_runtime()) == before
    # the storage a group lists still cannot be removed: the check and the reference are one transaction
    assert code(call(client, "removeStorage", {"storage_unique_name": "nfs_01"})) == "INVALID_ARGUMENT"
