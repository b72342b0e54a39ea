"""What upstream's own clients, test cases and dashboards rely on (API.md), over HTTP."""
from tests.integration.control.harness import call, client, code, control, register_request, runtime  # noqa: F401
from tests.integration.test_ops_metrics import scrape

#: The group upstream's reclaim and quota cases create: ``used_percentage`` 3.2 switches
#: the percentage trigger off; the meta storage settings are accepted and stored.
UPSTREAM_RECLAIM_GROUP = {
    "name": "test_group_01",
    "storage_candidates": ["test_storage_01"],
    "global_quota_group_name": "quota_group_test",
    "max_instance_count": 8,
    "quota": {"capacity": 1024 * 32, "quota_config": [{"storage_type": 3, "capacity": 1024 * 16},
                                                      {"storage_type": 4, "capacity": 1024 * 16}]},
    "cache_config": {
        "reclaim_strategy": {"storage_unique_name": "test_storage_01", "reclaim_policy": 1,
                             "trigger_strategy": {"used_percentage": 3.2}, "delay_before_delete_ms": 100},
        "data_storage_strategy": 2,
        "meta_indexer_config": {"max_key_count": 16, "mutex_shard_num": 16,
                                "meta_storage_backend_config": {"storage_type": "local",
                                                                "storage_uri": "file:///tmp/meta_storage"},
                                "meta_cache_policy_config": {"capacity": 1 << 30, "type": "LRU"},
                                "persist_metadata_interval_time_ms": 0}},
    "user_data": "user-defined info",
    "version": 1,
}


def used_percentage(client, name="test_group_01") -> float:
    group = call(client, "getInstanceGroup", {"name": name})["instance_group"]
    return group["cache_config"]["reclaim_strategy"]["trigger_strategy"]["used_percentage"]


def test_a_group_of_upstream_reclaim_cases_is_created_and_updated_with_used_percentage_above_one(client):
    assert code(call(client, "createInstanceGroup", {"instance_group": UPSTREAM_RECLAIM_GROUP})) == "OK"
    assert used_percentage(client) == 3.2
    update = {**UPSTREAM_RECLAIM_GROUP, "version": 2,
              "cache_config": {**UPSTREAM_RECLAIM_GROUP["cache_config"], "reclaim_strategy": {
                  **UPSTREAM_RECLAIM_GROUP["cache_config"]["reclaim_strategy"],
                  "trigger_strategy": {"used_percentage": 5}}}}
    assert code(call(client, "updateInstanceGroup", {"instance_group": update, "current_version": 1})) == "OK"
    assert used_percentage(client) == 5.0


def test_list_instance_info_of_a_group_that_does_not_exist_is_ok_and_empty(client, control):
    call(client, "createInstanceGroup", {"instance_group": {"name": "g1", "storage_candidates": ["nfs1"]}})
    control.register_instance(register_request("i1"))
    unknown = call(client, "listInstanceInfo", {"instance_group_name": "nope"})
    assert code(unknown) == "OK" and unknown["instance_info"] == []
    assert [i["instance_id"] for i in call(client, "listInstanceInfo", {"instance_group_name": "g1"})
            ["instance_info"]] == ["i1"]


def test_service_metrics_are_tagged_with_the_upstream_rpc_name(client):
    call(client, "addStorage", {"storage": {"global_unique_name": "nfs1", "nfs": {"root_path": "/mnt/kvcm"}}})
    call(client, "listInstanceInfo", {})
    call(client, "getCacheLocation", {"instance_id": "nope", "query_type": "QT_PREFIX_MATCH", "block_keys": [1]})
    metrics = call(client, "getMetrics")["metrics"]
    tagged = {(m["metric_name"], t["tag_value"]) for m in metrics for t in m["metric_tags"] if t["tag_key"] == "api_name"}
    assert {("service.query_counter", "AddStorage"), ("service.query_counter", "ListInstanceInfo"),
            ("service.query_counter", "GetCacheLocation"), ("service.query_rt_us", "AddStorage"),
            ("service.error_counter", "GetCacheLocation")} <= tagged
    assert all(value[0].isupper() for _, value in tagged), sorted(tagged)
    lines = scrape(client)[2].splitlines()
    assert 'kvcmtest_service_query_counter_total{api_name="AddStorage"} 1' in lines
    assert not any('api_name="addStorage"' in line for line in lines)
