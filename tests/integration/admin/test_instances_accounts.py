"""AdminService instance and account methods over HTTP."""

import json

from tests.integration.control.harness import add_storages, call, code, group_json, message, register_request


def setup_instances(client, control):
    add_storages(control)
    call(client, "createInstanceGroup", {"instance_group": group_json("g1", global_quota_group_name="q")})
    call(client, "createInstanceGroup", {"instance_group": group_json("g2")})
    control.register_instance(register_request("i1"))
    control.register_instance(register_request("i2", group_name="g2", block_size=64))


def test_list_instance_info(client, control):
    setup_instances(client, control)
    everything = call(client, "listInstanceInfo", {})["instance_info"]
    assert [(i["instance_id"], i["instance_group_name"], i["quota_group_name"]) for i in everything] == [
        ("i1", "g1", "q"),
        ("i2", "g2", "g2"),
    ]
    only_g2 = call(client, "listInstanceInfo", {"instanceGroupName": "g2"})["instance_info"]
    assert len(only_g2) == 1 and only_g2[0]["block_size"] == 64
    assert only_g2[0]["location_spec_infos"] == [{"name": "tp0", "size": "1024"}, {"name": "tp1", "size": "1024"}]
    assert only_g2[0]["model_deployment"]["model_name"] == "qwen"
    unknown = call(client, "listInstanceInfo", {"instance_group_name": "nope"})
    assert (code(unknown), unknown["instance_info"]) == ("OK", [])  # as upstream answers


def test_remove_instance(client, control):
    setup_instances(client, control)
    wrong_group = call(client, "removeInstance", {"instance_group": "g2", "instance_id": "i1"})
    assert code(wrong_group) == "INVALID_ARGUMENT" and "instance_group" in message(wrong_group)
    assert control.get_instance("i1") is not None
    assert code(call(client, "removeInstance", {"instance_group": "g1", "instance_id": "i1"})) == "OK"
    assert control.get_instance("i1") is None
    assert code(call(client, "removeInstance", {"instance_id": "i1"})) == "INSTANCE_NOT_EXIST"
    assert [i["instance_id"] for i in call(client, "listInstanceInfo", {})["instance_info"]] == ["i2"]


def test_accounts_never_return_secrets(client, runtime):
    assert (
        code(call(client, "addAccount", {"user_name": "alice", "password": "correct horse", "role": "ROLE_ADMIN"}))
        == "OK"
    )
    assert code(call(client, "addAccount", {"userName": "bob", "password": "battery", "role": 0})) == "OK"
    dup = call(client, "addAccount", {"user_name": "alice", "password": "x"})
    assert code(dup) == "DUPLICATE_ENTITY"
    listed = call(client, "listAccount")
    assert listed["accounts"] == [
        {"user_name": "alice", "role": "ROLE_ADMIN", "instance_groups": ["*"], "instance_id_prefixes": []},
        {"user_name": "bob", "role": "ROLE_USER", "instance_groups": ["*"], "instance_id_prefixes": []},
    ]
    text = json.dumps(listed)
    assert "scrypt" not in text and "correct horse" not in text and "battery" not in text
    assert runtime.control.verify_account("alice", "correct horse") is not None
    assert code(call(client, "deleteAccount", {"user_name": "alice"})) == "OK"
    gone = call(client, "deleteAccount", {"user_name": "alice"})
    assert (code(gone), message(gone)) == ("INVALID_ARGUMENT", "account 'alice' does not exist")
    assert [a["user_name"] for a in call(client, "listAccount")["accounts"]] == ["bob"]
