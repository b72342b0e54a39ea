"""Issue 22: reportEvent and getHostCacheState as upstream's newest suites hold them, on
real Valkey and moto through the app."""

from __future__ import annotations

import re
from pathlib import Path

from .harness import ER_SPECS, HEARTBEAT, HOST, HOST_DOWN, REGISTER, add, code, report, snapshot

README = Path(__file__).resolve().parents[3] / "README.md"

# ---------------------------------------------------------------- snapshot_required


def test_a_first_snapshot_answers_snapshot_not_required(http, er):
    resp = report(http, [snapshot(1, 2)])
    assert code(resp) == "OK" and re.fullmatch("[0-9a-f]{32}", resp["committed_snapshot_version"])
    assert resp["snapshot_required"] is False


def test_register_snapshot_and_heartbeat_in_one_request_answer_not_required(http, er):
    resp = report(http, [REGISTER, snapshot(1), HEARTBEAT], host="10.0.0.5:1")
    assert code(resp) == "OK" and resp["committed_snapshot_version"] != ""
    assert resp["snapshot_required"] is False
    assert report(http, [HEARTBEAT], host="10.0.0.5:1")["snapshot_required"] is False


def test_deltas_after_host_down_still_ask_for_a_snapshot(http, er):
    """Only a committed snapshot clears the request: deltas opening a new generation do not."""
    report(http, [snapshot(1)])
    report(http, [HOST_DOWN])
    report(http, [REGISTER])
    assert report(http, [add(5), HEARTBEAT])["snapshot_required"] is True


# ---------------------------------------------------------------- HOST_DOWN forgets


def test_host_down_forgets_the_reporter_so_its_next_snapshot_is_accepted(http, er, clock):
    first = report(http, [REGISTER, snapshot(1, 2)])
    assert code(first) == "OK"
    assert code(report(http, [HOST_DOWN])) == "OK"
    assert code(report(http, [REGISTER])) == "OK"
    assert code(report(http, [add(3)])) == "OK"
    clock.advance(0.02)
    again = report(http, [snapshot(3)])
    assert code(again) == "OK", again
    assert again["retry_after_ms"] == "0" and again["snapshot_required"] is False
    token = again["committed_snapshot_version"]
    assert token not in ("", first["committed_snapshot_version"])
    # The reporter is held to the limit again from this snapshot on.
    clock.advance(0.02)
    assert code(report(http, [snapshot(3)])) == "SNAPSHOT_RATE_LIMITED"


def test_a_reporter_expired_past_its_grace_is_forgotten_too(http, er, clock):
    report(http, [REGISTER, snapshot(1)])
    clock.advance(3.1)  # heartbeat timeout 1 s + grace 2 s
    assert code(report(http, [REGISTER])) == "OK"
    assert code(report(http, [snapshot(1)])) == "OK"


# ---------------------------------------------------------------- getHostCacheState fields


def _state(http, keys, instance="e1", **extra):
    body = {"instance_id": instance, "block_cache_keys": keys, **extra}
    resp = http("getHostCacheState", body)
    assert code(resp) == "OK", resp
    return resp["hosts"]


def test_host_state_sends_both_field_names_and_omits_a_zero_fetch(http, er):
    report(http, [add(k) for k in (1, 2, 3)])
    [host] = _state(http, [1, 2, 3, 4], query_type="QT_PREFIX_MATCH")
    assert host == {"host_ip_port": HOST, "prefix_match_blocks": "3", "local": "3", "p2p_1_total_match": "3"}
    assert "p2p_1_fetch" not in host


def test_hosts_with_equal_prefixes_come_in_host_order(http, er):
    for host in ("10.0.0.3:8080", "10.0.0.1:8080", "10.0.0.2:8080"):
        report(http, [add(k) for k in (1, 2)], host=host)
    report(http, [add(3)], host="10.0.0.2:8080")
    hosts = _state(http, [1, 2, 3], query_type="QT_PREFIX_MATCH")
    assert [h["host_ip_port"] for h in hosts] == ["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"]
    assert [h["local"] for h in hosts] == ["2", "3", "2"]


def _register(http, instance, **extra):
    resp = http(
        "registerInstance",
        {
            "instance_group": "ger",
            "instance_id": instance,
            "block_size": 4,
            "location_spec_infos": ER_SPECS,
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
            **extra,
        },
    )
    assert code(resp) == "OK", resp
    return resp


def test_the_old_registration_field_query_type_is_the_default_query_type(http, er):
    _register(http, "old", query_type="QT_PREFIX_MATCH_WITH_MAMBA")
    info = http("getInstanceInfo", {"instance_id": "old"})["instance_info"]
    assert info["default_query_type"] == "QT_PREFIX_MATCH_WITH_MAMBA"
    # No F/L spec groups: the Mamba default is what the request is refused for.
    resp = http("getHostCacheState", {"instance_id": "old", "block_cache_keys": [1]})
    assert code(resp) == "INVALID_ARGUMENT" and "QT_PREFIX_MATCH_WITH_MAMBA" in resp["header"]["status"]["message"]


def test_host_state_without_any_query_type_is_a_prefix_match(http, er):
    _register(http, "plain")
    report(http, [add(k) for k in (1, 2)], instance="plain")
    assert [(h["host_ip_port"], h["local"]) for h in _state(http, [1, 2, 3], instance="plain")] == [(HOST, "2")]


def test_the_old_and_new_registration_fields_together_must_agree(http, er):
    resp = http(
        "registerInstance",
        {
            "instance_group": "ger",
            "instance_id": "both",
            "block_size": 4,
            "location_spec_infos": ER_SPECS,
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
            "query_type": "QT_BATCH_GET",
            "default_query_type": "QT_PREFIX_MATCH",
        },
    )
    assert code(resp) == "INVALID_ARGUMENT" and "query_type" in resp["header"]["status"]["message"]
    assert code(http("getInstanceInfo", {"instance_id": "both"})) == "INSTANCE_NOT_EXIST"


# ---------------------------------------------------------------- getHostCacheState: upstream's newest rules


def _write(http, instance, keys, finish=True):
    start = http("startWriteCache", {"instance_id": instance, "block_keys": keys})
    assert code(start) == "OK", start
    if finish:
        mask = {"offset": len(start["locations"])}
        body = {"instance_id": instance, "write_session_id": start["write_session_id"], "success_blocks": mask}
        assert code(http("finishWriteCache", body)) == "OK"


def test_only_serving_reported_locations_count(http, er, clock):
    """Blocks of the write path in any state (WRITING, SERVING, DELETING) are no host's;
    a reporter's hidden (retired) generation counts for nothing either."""
    _write(http, "e1", [1, 2])  # SERVING in the block index
    _write(http, "e1", [3], finish=False)  # WRITING
    assert code(http("removeCache", {"instance_id": "e1", "block_keys": [2]})) == "OK"  # DELETING
    assert _state(http, [1, 2, 3], query_type="QT_PREFIX_MATCH") == []
    report(http, [add(1), add(2), add(3)])
    assert [h["local"] for h in _state(http, [1, 2, 3], query_type="QT_PREFIX_MATCH")] == ["3"]
    report(http, [HOST_DOWN])  # retired: hidden at once, before the liveness job cleans it
    assert _state(http, [1, 2, 3], query_type="QT_PREFIX_MATCH") == []


def test_a_backend_error_inside_the_prefix_is_returned_not_a_shorter_prefix(http, er, runtime, valkey):
    report(http, [add(1), add(2)])
    bits = runtime.reporters.bits_key("e1")
    valkey.delete(bits)
    valkey.set(bits, "not a hash")  # the index unreadable
    resp = http("getHostCacheState", {"instance_id": "e1", "query_type": "QT_PREFIX_MATCH", "block_cache_keys": [1, 2]})
    assert code(resp) not in ("OK", "INVALID_ARGUMENT") and resp["hosts"] == []
    assert resp["header"]["status"]["message"]


def test_host_down_cleanup_leaves_the_block_index_and_its_recency_alone(http, er, runtime, valkey, clock):
    _write(http, "e1", [1, 2, 3])
    http("getCacheLocation", {"instance_id": "e1", "query_type": "QT_PREFIX_MATCH", "block_keys": [1, 2, 3]})
    report(http, [REGISTER, add(1), add(2), add(3)])
    tag = runtime.reporters.node_key("e1", "x").partition(":er:")[0]
    index_keys = sorted(k for k in valkey.keys(f"{tag}*") if b":er:" not in k)
    assert index_keys
    before = {k: valkey.dump(k) for k in index_keys}
    clock.advance(5)
    report(http, [HOST_DOWN])
    assert runtime.reporter_liveness.event_report_liveness()["locations_cleaned"] == 3
    assert {k: valkey.dump(k) for k in index_keys} == before


# ---------------------------------------------------------------- listed deviations


def test_meta_rpc_port_is_zero_and_listed_as_a_deviation(http, runtime):
    runtime.reconfigure(advertised_endpoint="127.0.0.1:8123")
    endpoint = http("getClusterInfo", {})["leader_endpoint"]
    assert endpoint["meta_rpc_port"] == 0 and endpoint["meta_http_port"] == 8123
    rows = [line for line in README.read_text(encoding="utf-8").splitlines() if "meta_rpc_port" in line]
    assert rows and all("deviates" in row and "gRPC" in row for row in rows)
