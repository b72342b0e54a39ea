"""What upstream's own clients, test cases and dashboards rely on (API.md), over HTTP."""

from tests.integration.control.harness import add_storages, call, code, register_request
from tests.integration.observability.test_ops_metrics import scrape

#: The group upstream's reclaim and quota cases create: ``used_percentage`` 3.2 switches
#: the percentage trigger off; the meta storage settings are accepted and stored.
UPSTREAM_RECLAIM_GROUP = {
    "name": "test_group_01",
    "storage_candidates": ["test_storage_01"],
    "global_quota_group_name": "quota_group_test",
    "max_instance_count": 8,
    "quota": {
        "capacity": 1024 * 32,
        "quota_config": [{"storage_type": 3, "capacity": 1024 * 16}, {"storage_type": 4, "capacity": 1024 * 16}],
    },
    "cache_config": {
        "reclaim_strategy": {
            "storage_unique_name": "test_storage_01",
            "reclaim_policy": 1,
            "trigger_strategy": {"used_percentage": 3.2},
            "delay_before_delete_ms": 100,
        },
        "data_storage_strategy": 2,
        "meta_indexer_config": {
            "max_key_count": 16,
            "mutex_shard_num": 16,
            "meta_storage_backend_config": {"storage_type": "local", "storage_uri": "file:///tmp/meta_storage"},
            "meta_cache_policy_config": {"capacity": 1 << 30, "type": "LRU"},
            "persist_metadata_interval_time_ms": 0,
        },
    },
    "user_data": "user-defined info",
    "version": 1,
}


def used_percentage(client, name="test_group_01") -> float:
    group = call(client, "getInstanceGroup", {"name": name})["instance_group"]
    return group["cache_config"]["reclaim_strategy"]["trigger_strategy"]["used_percentage"]


def test_a_group_of_upstream_reclaim_cases_is_created_and_updated_with_used_percentage_above_one(client, control):
    add_storages(control, *UPSTREAM_RECLAIM_GROUP["storage_candidates"])
    assert code(call(client, "createInstanceGroup", {"instance_group": UPSTREAM_RECLAIM_GROUP})) == "OK"
    assert used_percentage(client) == 3.2
    update = {
        **UPSTREAM_RECLAIM_GROUP,
        "version": 2,
        "cache_config": {
            **UPSTREAM_RECLAIM_GROUP["cache_config"],
            "reclaim_strategy": {
                **UPSTREAM_RECLAIM_GROUP["cache_config"]["reclaim_strategy"],
                "trigger_strategy": {"used_percentage": 5},
            },
        },
    }
    assert code(call(client, "updateInstanceGroup", {"instance_group": update, "current_version": 1})) == "OK"
    assert used_percentage(client) == 5.0


def test_list_instance_info_of_a_group_that_does_not_exist_is_ok_and_empty(client, control):
    add_storages(control)
    call(client, "createInstanceGroup", {"instance_group": {"name": "g1", "storage_candidates": ["nfs1"]}})
    control.register_instance(register_request("i1"))
    unknown = call(client, "listInstanceInfo", {"instance_group_name": "nope"})
    assert code(unknown) == "OK" and unknown["instance_info"] == []
    assert [
        i["instance_id"] for i in call(client, "listInstanceInfo", {"instance_group_name": "g1"})["instance_info"]
    ] == ["i1"]


def test_service_metrics_are_tagged_with_the_upstream_rpc_name(client):
    call(client, "addStorage", {"storage": {"global_unique_name": "nfs1", "nfs": {"root_path": "/mnt/kvcm"}}})
    call(client, "listInstanceInfo", {})
    call(client, "getCacheLocation", {"instance_id": "nope", "query_type": "QT_PREFIX_MATCH", "block_keys": [1]})
    metrics = call(client, "getMetrics")["metrics"]
    tagged = {
        (m["metric_name"], t["tag_value"]) for m in metrics for t in m["metric_tags"] if t["tag_key"] == "api_name"
    }
    assert {
        ("service.query_counter", "AddStorage"),
        ("service.query_counter", "ListInstanceInfo"),
        ("service.query_counter", "GetCacheLocation"),
        ("service.query_rt_us", "AddStorage"),
        ("service.error_counter", "GetCacheLocation"),
    } <= tagged
    assert all(value[0].isupper() for _, value in tagged), sorted(tagged)
    lines = scrape(client)[2].splitlines()
    assert 'kvcmtest_service_query_counter_total{api_name="AddStorage"} 1' in lines
    assert not any('api_name="addStorage"' in line for line in lines)


# Upstream's admin interface cases (integration_test/admin_service/admin_interface_cases.py),
# replayed as its HTTP client sends them.
TRACE = {"trace_id": "test_trace_id"}
SAMPLE_GROUP = {
    "name": "test_instance_group",
    "storage_candidates": ["test_storage_01", "test_storage_02"],
    "global_quota_group_name": "quota_group_test",
    "max_instance_count": 10,
    "quota": {
        "capacity": 1000,
        "quota_config": [{"storage_type": 4, "capacity": 500}, {"storage_type": 3, "capacity": 500}],
    },
    "cache_config": {
        "reclaim_strategy": {
            "storage_unique_name": "test_storage_01",
            "reclaim_policy": 1,
            "trigger_strategy": {"used_size": 1 << 30, "used_percentage": 0.8},
            "trigger_period_seconds": 60,
            "reclaim_step_size": 512 << 20,
            "reclaim_step_percentage": 5,
        },
        "data_storage_strategy": 2,
        "meta_indexer_config": {
            "max_key_count": 1000000,
            "mutex_shard_num": 16,
            "meta_storage_backend_config": {"storage_type": "local", "storage_uri": "file:///tmp/meta_storage"},
            "meta_cache_policy_config": {"capacity": 1 << 30, "type": "LRU"},
        },
    },
    "user_data": "user-defined info",
    "version": 1,
}
SAMPLE_DEPLOYMENT = {
    "model_name": "gpt_test",
    "dtype": "FP16",
    "use_mla": False,
    "tp_size": 1,
    "dp_size": 1,
    "lora_name": "lora_hash_123",
    "pp_size": 2,
    "extra": "extra_info",
    "user_data": "user_data_example",
}


def sample_register(**overrides) -> dict:
    return {
        **TRACE,
        "instance_group": "test_instance_group",
        "instance_id": "instance_123",
        "block_size": 128,
        "model_deployment": dict(SAMPLE_DEPLOYMENT),
        "location_spec_infos": [{"name": "tp0", "size": 2048}],
        **overrides,
    }


def ok(data: dict) -> dict:
    assert code(data) == "OK", data
    return data


def test_upstream_admin_cases_storage_group_and_instance_lifecycle(client, control):
    ok(
        call(
            client,
            "addStorage",
            {**TRACE, "storage": {"global_unique_name": "test_storage_01", "nfs": {"root_path": "/tmp/1"}}},
        )
    )
    assert any(s["global_unique_name"] == "test_storage_01" for s in call(client, "listStorage", TRACE)["storage"])

    add_storages(control, "test_storage_02")  # the group's other candidate
    ok(call(client, "createInstanceGroup", {**TRACE, "instance_group": SAMPLE_GROUP}))
    updated = {**SAMPLE_GROUP, "user_data": "updated_data", "version": 2}
    ok(call(client, "updateInstanceGroup", {**TRACE, "instance_group": updated, "current_version": 1}))
    assert (
        ok(call(client, "getInstanceGroup", {**TRACE, "name": "test_instance_group"}))["instance_group"]["user_data"]
        == "updated_data"
    )

    ok(call(client, "registerInstance", sample_register()))
    info = call(client, "getInstanceInfo", {**TRACE, "instance_id": "instance_123"})
    assert info["instance_info"]["instance_id"] == "instance_123"
    listed = ok(call(client, "listInstanceInfo", {**TRACE, "instance_group_name": "test_instance_group"}))
    assert [i["instance_id"] for i in listed["instance_info"]] == ["instance_123"]
    assert "instance_info" in ok(call(client, "listInstanceInfo", {**TRACE, "instance_group_name": "test_not_exist"}))
    ok(call(client, "removeInstance", {**TRACE, "instance_id": "instance_123"}))
    ok(call(client, "removeInstanceGroup", {**TRACE, "name": "test_instance_group"}))

    metrics = ok(call(client, "getMetrics", TRACE))["metrics"]
    by_name = {
        (m["metric_name"], t["tag_value"]): m["metric_value"]
        for m in metrics
        for t in m["metric_tags"]
        if t["tag_key"] == "api_name"
    }
    assert int(by_name["service.query_counter", "AddStorage"]["int_value"]) > 0
    assert float(by_name["service.query_rt_us", "ListStorage"]["float_value"]) > 1


def test_upstream_admin_cases_register_and_remove_error_details(client, control):
    add_storages(control, *SAMPLE_GROUP["storage_candidates"])
    call(client, "createInstanceGroup", {**TRACE, "instance_group": SAMPLE_GROUP})
    status = call(client, "registerInstance", sample_register(block_size=0))["header"]["status"]
    assert status["code"] == "INVALID_ARGUMENT" and "block_size" in status["message"].lower()

    status = call(
        client,
        "registerInstance",
        sample_register(instance_group="totally_nonexistent_admin_group", instance_id="instance_no_group_admin"),
    )["header"]["status"]
    assert status["code"] != "OK" and "totally_nonexistent_admin_group" in status["message"]

    ok(call(client, "registerInstance", sample_register()))
    other_model = sample_register()
    other_model["model_deployment"]["model_name"] = "completely_different_model"
    status = call(client, "registerInstance", other_model)["header"]["status"]
    assert status["code"] == "DUPLICATE_ENTITY", status
    assert "instance_123" in status["message"] and "model_deployment" in status["message"], status
    status = call(client, "registerInstance", sample_register(block_size=256))["header"]["status"]
    assert status["code"] == "DUPLICATE_ENTITY" and "block_size" in status["message"], status

    status = call(client, "removeInstance", {**TRACE, "instance_id": "nonexistent_instance_for_remove"})["header"][
        "status"
    ]
    assert status["code"] not in ("OK", "INTERNAL_ERROR") and "nonexistent_instance_for_remove" in status["message"]
