"""The newer upstream surface's small methods (UPSTREAM_V2 §2.3, §2.4, §1.4):
getCacheLocationLen, getClusterInfo (with kvcm_client's leader discovery) and GET /api/healthy."""

from __future__ import annotations

import json

import pytest
from chalice.test import Client

from .harness import code, write


def test_cache_location_len_counts_as_upstream(http, instance):
    write(http, [1, 2, 4])
    ask = {"instance_id": instance, "block_keys": [1, 2, 3, 4]}
    assert http("getCacheLocationLen", {**ask, "query_type": "QT_PREFIX_MATCH"})["cache_location_len"] == "2"
    # Hits anywhere, not a prefix.
    assert http("getCacheLocationLen", {**ask, "query_type": "QT_BATCH_GET"})["cache_location_len"] == "3"
    window = http("getCacheLocationLen", {**ask, "query_type": "QT_REVERSE_ROLL_SW_MATCH", "sw_size": 2})
    assert code(window) == "OK" and int(window["cache_location_len"]) >= 1
    # Upstream's switch has no case for the Mamba prefix: 0.
    mamba = http("getCacheLocationLen", {**ask, "query_type": "QT_PREFIX_MATCH_WITH_MAMBA"})
    assert code(mamba) == "OK" and mamba["cache_location_len"] == "0"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"block_keys": [1]}, "instance_id"),
        ({"instance_id": "i1"}, "block_keys"),
        ({"instance_id": "i1", "block_keys": [1]}, "query_type"),
    ],
)
def test_cache_location_len_refuses_what_is_missing(http, instance, body, field):
    resp = http("getCacheLocationLen", body)
    assert code(resp) == "INVALID_ARGUMENT" and field in resp["header"]["status"]["message"]
    assert resp["cache_location_len"] == "0"


def test_cache_location_len_of_an_unknown_instance(http, instance):
    resp = http("getCacheLocationLen", {"instance_id": "nope", "query_type": "QT_BATCH_GET", "block_keys": [1]})
    assert code(resp) == "INSTANCE_NOT_EXIST"


def test_cluster_info_is_answered_by_any_node_and_names_the_api(http, runtime):
    runtime.reconfigure(advertised_endpoint="127.0.0.1:8123")
    resp = http("getClusterInfo", {"trace_id": "leader_discovery_1"})
    assert code(resp) == "OK" and resp["self_node_id"] == "test-node"
    endpoint = resp["leader_endpoint"]
    assert (endpoint["host"], endpoint["meta_http_port"]) == ("127.0.0.1", 8123)
    assert endpoint["node_id"] == (resp["leader_node_id"] or "test-node")


def test_cluster_info_names_the_lease_holder(http, runtime):
    assert runtime.lease.try_acquire()
    resp = http("getClusterInfo", {"instance_id": "whatever"})
    assert code(resp) == "OK" and resp["leader_node_id"] == "test-node"


def test_cluster_info_without_an_advertised_endpoint_has_none(http, runtime):
    resp = http("getClusterInfo", {})
    assert code(resp) == "OK" and "leader_endpoint" not in resp


def test_healthy_probe(runtime, monkeypatch):
    import app

    with Client(app.app) as chalice:
        ok = chalice.http.get("/api/healthy")
        assert ok.status_code == 200 and json.loads(ok.body) == {"status": "OK"}
        monkeypatch.setattr(runtime.valkey, "ping", lambda: (_ for _ in ()).throw(ConnectionError("down")))
        down = chalice.http.get("/api/healthy")
    assert down.status_code == 503
    body = json.loads(down.body)
    assert body["is_health"] is False and body["header"]["status"]["code"] == "OK"


def test_get_cache_location_refuses_the_mamba_query_type(http, instance):
    resp = http(
        "getCacheLocation", {"instance_id": instance, "block_keys": [1], "query_type": "QT_PREFIX_MATCH_WITH_MAMBA"}
    )
    assert code(resp) == "INVALID_ARGUMENT" and "query_type" in resp["header"]["status"]["message"]


def test_manager_cluster_info_names_the_api_with_its_admin_port(http, runtime):
    runtime.reconfigure(advertised_endpoint="127.0.0.1:8123")
    resp = http("getManagerClusterInfo", {})
    endpoint = resp["leader_endpoint"]
    assert code(resp) == "OK" and (endpoint["meta_http_port"], endpoint["admin_http_port"]) == (8123, 8123)


def test_min_replica_count_one_is_the_usual_write_and_negative_is_refused(http, instance):
    assert code(http("startWriteCache", {"instance_id": instance, "block_keys": [7], "min_replica_count": 1})) == "OK"
    resp = http("startWriteCache", {"instance_id": instance, "block_keys": [8], "min_replica_count": -1})
    assert code(resp) == "INVALID_ARGUMENT" and "min_replica_count" in resp["header"]["status"]["message"]
    assert http("getCacheMeta", {"instance_id": instance, "block_keys": [8]})["metas"] == [
        '{"id": "", "status": "CLS_NOT_FOUND"}'
    ]


@pytest.mark.parametrize("storage_type", ["ST_TAIRMEMPOOL_SSD"])  # ST_DUMMY: the ``local`` spec's type
def test_storage_types_without_a_backend_say_so(http, runtime, storage_type):
    resp = http(
        "addStorage",
        {
            "storage": {
                "global_unique_name": "x1",
                "storage_type": storage_type,
                "tair_mem_pool": {"domain": "127.0.0.1:1", "capacity": 1024},
            }
        },
    )
    assert code(resp) == "INVALID_ARGUMENT" and "has no backend in KVCM" in resp["header"]["status"]["message"]
