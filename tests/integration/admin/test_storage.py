"""AdminService storage methods over HTTP."""

from tests.integration.control.harness import call, code, group_json, message, nfs


def storages(client) -> dict:
    return {s["global_unique_name"]: s for s in call(client, "listStorage")["storage"]}


def test_add_and_list(client):
    assert code(call(client, "addStorage", {"storage": nfs("nfs1")})) == "OK"
    call(client, "addStorage", {"storage": {"globalUniqueName": "bucket", "s3": {"bucket": "b", "prefix": "p/"}}})
    listed = storages(client)
    assert listed["nfs1"]["nfs"] == {"root_path": "/mnt/kvcm", "key_count_per_file": 4}
    assert listed["bucket"]["s3"] == {"bucket": "b", "prefix": "p/", "region": ""}


def test_duplicate_is_refused_and_the_original_unchanged(client):
    call(client, "addStorage", {"storage": nfs("nfs1", "/first")})
    data = call(client, "addStorage", {"storage": nfs("nfs1", "/second")})
    assert code(data) == "DUPLICATE_ENTITY" and "nfs1" in message(data)
    assert storages(client)["nfs1"]["nfs"]["root_path"] == "/first"


def test_enable_disable_flip_availability(client, control):
    call(client, "addStorage", {"storage": nfs("nfs1")})
    assert code(call(client, "disableStorage", {"storage_unique_name": "nfs1"})) == "OK"
    assert control.get_storage("nfs1").available is False
    assert code(call(client, "enableStorage", {"storageUniqueName": "nfs1"})) == "OK"
    assert control.get_storage("nfs1").available is True


def test_unknown_storage_is_named(client):
    for method in ("enableStorage", "disableStorage", "removeStorage"):
        data = call(client, method, {"storage_unique_name": "ghost"})
        assert (code(data), message(data)) == ("INVALID_ARGUMENT", "storage 'ghost' does not exist")
    data = call(client, "updateStorage", {"storage": nfs("ghost")})
    assert (code(data), message(data)) == ("INVALID_ARGUMENT", "storage 'ghost' does not exist")


def test_update_replaces_the_config(client, control):
    call(client, "addStorage", {"storage": nfs("nfs1", "/old")})
    call(client, "disableStorage", {"storage_unique_name": "nfs1"})
    assert code(call(client, "updateStorage", {"storage": nfs("nfs1", "/new")})) == "OK"
    record = control.get_storage("nfs1")
    assert (record.config.nfs.root_path, record.available) == ("/new", False)
    s3 = {"global_unique_name": "nfs1", "s3": {"bucket": "b"}}
    data = call(client, "updateStorage", {"storage": s3})
    assert code(data) == "INVALID_ARGUMENT" and "force_update" in message(data)
    assert code(call(client, "updateStorage", {"storage": s3, "force_update": True})) == "OK"
    assert control.get_storage("nfs1").config.s3.bucket == "b"


def test_backend_specific_validation(client):
    data = call(client, "addStorage", {"storage": nfs("nfs1", "relative/path")})
    assert code(data) == "INVALID_ARGUMENT" and "nfs.root_path" in message(data)
    assert storages(client) == {}


def test_storage_used_by_a_group_cannot_be_removed(client):
    call(client, "addStorage", {"storage": nfs("nfs1")})
    call(client, "createInstanceGroup", {"instance_group": group_json("g1", "nfs1")})
    data = call(client, "removeStorage", {"storage_unique_name": "nfs1"})
    assert code(data) == "INVALID_ARGUMENT" and "'g1'" in message(data)
    assert "nfs1" in storages(client)
    call(client, "removeInstanceGroup", {"name": "g1"})
    assert code(call(client, "removeStorage", {"storage_unique_name": "nfs1"})) == "OK"
    assert storages(client) == {}
