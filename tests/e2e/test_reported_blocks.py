"""The local stack serves the newer upstream surface end to end: an event-report storage
and group made over the admin API, an engine reporting its blocks, a router asking where
to go (reportEvent, getHostCacheState, getCacheLocationsByBackend over HTTP)."""

from __future__ import annotations

from .harness import Api


def ok(api: Api, method: str, body: dict) -> dict:
    status, answer = api.call(method, body)
    assert status == 200 and answer["header"]["status"]["code"] == "OK", answer
    return answer


def test_an_engine_reports_and_a_router_routes(api: Api):
    ok(
        api,
        "addStorage",
        {"storage": {"global_unique_name": "e2e_l2", "storage_type": "ST_EVENT_REPORT_L2", "event_report": {}}},
    )
    ok(
        api,
        "createInstanceGroup",
        {
            "instance_group": {
                "name": "e2e_reported",
                "storage_candidates": ["nfs_01"],
                "event_report_storage_candidates": ["e2e_l2"],
            }
        },
    )
    ok(
        api,
        "registerInstance",
        {
            "instance_group": "e2e_reported",
            "instance_id": "e2e-engine",
            "block_size": 4,
            "location_spec_infos": [{"name": "tp0", "size": 4096}],
            "model_deployment": {"model_name": "m", "dtype": "bf16"},
        },
    )
    events = [{"event_type": "EVENT_NODE_REGISTER", "node_register": {"mediums": ["mem"]}}] + [
        {
            "event_type": "EVENT_BLOCK_ADD",
            "block_add": {
                "block_key": str(k),
                "medium": "mem",
                "specs": [{"name": "tp0", "uri": f"vineyard://10.0.0.5:9600/mem/{k}"}],
            },
        }
        for k in (1, 2, 3)
    ]
    answer = ok(
        api,
        "reportEvent",
        {
            "instance_id": "e2e-engine",
            "host_ip_port": "10.0.0.5:8080",
            "storage_type": "ST_EVENT_REPORT_L2",
            "events": events,
        },
    )
    assert len(answer["committed_snapshot_version"]) == 32
    hosts = ok(
        api,
        "getHostCacheState",
        {"instance_id": "e2e-engine", "query_type": "QT_PREFIX_MATCH", "block_cache_keys": [1, 2, 3, 4]},
    )["hosts"]
    assert [(h["host_ip_port"], h["local"]) for h in hosts] == [("10.0.0.5:8080", "3")]
    vectors = ok(
        api,
        "getCacheLocationsByBackend",
        {
            "instance_id": "e2e-engine",
            "query_type": "QT_BATCH_GET",
            "block_keys": [1, 4],
            "backend_selectors": [{"backend_type": "ST_EVENT_REPORT_L2", "strategy": "LSS_V6D_COVERAGE"}],
        },
    )
    assert [len(v["locations"]) for v in vectors["key_locations"]] == [1, 0]
    ok(api, "removeInstance", {"instance_group": "e2e_reported", "instance_id": "e2e-engine"})
    ok(api, "removeInstanceGroup", {"name": "e2e_reported"})
    ok(api, "removeStorage", {"storage_unique_name": "e2e_l2"})
