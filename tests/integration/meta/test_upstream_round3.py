"""Issue 22: reportEvent and getHostCacheState as upstream's newest suites hold them, on
real Valkey and moto through the app."""

from __future__ import annotations

import re

from .harness import ER_SPECS, HEARTBEAT, HOST, HOST_DOWN, REGISTER, add, code, report, snapshot

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
