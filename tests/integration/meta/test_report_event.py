"""reportEvent and getHostCacheState on real Valkey and moto (UPSTREAM_V2 §2.1, §2.2)."""

from __future__ import annotations

import re

import pytest

from .harness import (
    ER_SPECS,
    HEARTBEAT,
    HOST,
    HOST2,
    HOST_DOWN,
    L1,
    L2,
    REGISTER,
    add,
    code,
    delete,
    hosts,
    report,
    reported_state,
    snapshot,
)

# ---------------------------------------------------------------- events


def test_register_then_add_is_visible_with_versioned_uris(http, er, runtime):
    first = report(http, [REGISTER])
    assert code(first) == "OK" and first["snapshot_required"] is True
    assert first["committed_snapshot_version"] == "" and first["extra_info"] == '{"zone":"a"}'
    assert first["item_results"] == []
    assert (
        http(
            "registerInstance",
            {
                "instance_group": "ger",
                "instance_id": "e1",
                "block_size": 4,
                "location_spec_infos": ER_SPECS,
                "model_deployment": {"model_name": "m", "dtype": "fp16"},
                "location_spec_groups": [
                    {"name": "F0", "spec_names": ["full_0"]},
                    {"name": "L0", "spec_names": ["linear_0"]},
                ],
            },
        )["extra_info"]
        == '{"zone":"a"}'
    )
    added = report(
        http,
        [
            add(
                100,
                full_0="event_report://10.0.0.8:9600/gpu/100?size=4096",
                linear_0="event_report://10.0.0.8:9600/gpu/100?size=1024",
            ),
            add(101),
            HEARTBEAT,
        ],
    )
    token = added["committed_snapshot_version"]
    assert code(added) == "OK" and re.fullmatch("[0-9a-f]{32}", token) and added["snapshot_required"] is True
    [(location_id, medium, specs)] = runtime.reporters.locations("e1", 100)
    assert location_id == f"kvs#event_report_l1p5#gpu#{HOST}" and medium == "gpu"
    assert dict(specs) == {
        "full_0": f"event_report://10.0.0.8:9600/gpu/100?size=4096&s_version={token}",
        "linear_0": f"event_report://10.0.0.8:9600/gpu/100?size=1024&s_version={token}",
    }
    assert hosts(http, [100, 101, 102]) == {HOST: 2}
    again = report(http, [add(102)])
    assert again["snapshot_required"] is False and again["committed_snapshot_version"] == token
    assert hosts(http, [100, 101, 102]) == {HOST: 3}


def test_add_merges_by_spec_name_and_delete_keeps_siblings(http, er, runtime):
    report(
        http,
        [
            add(7, full_0="event_report://h/a"),
            add(7, linear_0="event_report://h/b"),
            add(7, full_0="event_report://h/c"),
        ],
    )
    [(_, _, specs)] = runtime.reporters.locations("e1", 7)
    assert [(n, u.split("&")[0].split("?")[0]) for n, u in specs] == [
        ("full_0", "event_report://h/c"),
        ("linear_0", "event_report://h/b"),
    ]
    resp = report(http, [delete(7, names=["linear_0"]), delete(8), delete(7, medium="disk")])
    assert code(resp) == "OK" and resp["item_results"] == []  # missing block, location: idempotent OK
    [(_, _, specs)] = runtime.reporters.locations("e1", 7)
    assert [n for n, _ in specs] == ["full_0"]
    report(http, [delete(7)])
    assert runtime.reporters.locations("e1", 7) == [] and hosts(http, [7]) == {}


def test_two_mediums_of_one_block_are_two_locations(http, er, runtime):
    report(http, [add(5, "gpu"), add(5, "mem")])
    assert sorted(m for _, m, _ in runtime.reporters.locations("e1", 5)) == ["gpu", "mem"]
    assert hosts(http, [5], medium=["mem"]) == {HOST: 1}
    assert hosts(http, [5], medium=["disk"]) == {}


def test_host_down_hides_at_once_and_the_liveness_job_cleans(http, er, runtime, clock):
    report(http, [add(1), add(2)])
    report(http, [add(1)], host=HOST2)
    down = report(http, [HOST_DOWN])
    assert code(down) == "OK" and down["committed_snapshot_version"] == ""
    assert hosts(http, [1, 2]) == {HOST2: 1}
    assert code(report(http, [HOST_DOWN])) == "OK"  # idempotent
    refused = report(http, [add(3), REGISTER])
    assert code(refused) == "NODE_NOT_REGISTERED" and refused["item_results"] == ["NODE_NOT_REGISTERED", "OK"]
    assert refused["header"]["status"]["message"] == "ReportEvent partially failed"
    # Re-registered, the old generation stays hidden until cleaned, and is cleaned.
    assert hosts(http, [1, 2]) == {HOST2: 1}

    assert runtime.reporter_liveness.event_report_liveness()["locations_cleaned"] == 2
    assert [loc for loc, _, _ in runtime.reporters.locations("e1", 1)] == [f"kvs#event_report_l1p5#gpu#{HOST2}"]
    assert runtime.reporters.locations("e1", 2) == []
    assert runtime.reporters.reporter("e1", "l1p5#" + HOST).retired == ""


def test_heartbeat_timeout_hides_grace_restores_then_unregisters(http, er, runtime, clock):
    report(http, [REGISTER, add(1)])
    clock.advance(1.5)  # past the 1 s heartbeat timeout
    assert hosts(http, [1]) == {}
    assert code(report(http, [HEARTBEAT])) == "OK"  # within the 2 s grace: back, same generation
    assert hosts(http, [1]) == {HOST: 1}
    clock.advance(3.5)  # past timeout + grace

    assert runtime.reporter_liveness.event_report_liveness()["locations_cleaned"] == 1
    assert not runtime.reporters.reporter("e1", "l1p5#" + HOST).registered
    assert code(report(http, [HEARTBEAT])) == "NODE_NOT_REGISTERED"
    assert code(report(http, [REGISTER])) == "OK" and hosts(http, [1]) == {}


def test_add_and_delete_do_not_refresh_the_heartbeat(http, er, clock):
    report(http, [REGISTER, add(1)])
    clock.advance(0.8)
    report(http, [add(2)])
    clock.advance(0.4)
    assert hosts(http, [1, 2]) == {}


def test_snapshot_makes_the_reporter_strict_and_is_rate_limited(http, er, runtime, clock):
    delta = report(http, [add(1), add(2), add(3)])
    snap = report(http, [REGISTER, snapshot(1, 2)])
    token = snap["committed_snapshot_version"]
    assert code(snap) == "OK" and token != delta["committed_snapshot_version"] and snap["snapshot_required"] is False
    assert hosts(http, [1, 2, 3]) == {HOST: 2}
    assert hosts(http, [3]) == {}  # not in the snapshot: an older generation, hidden
    assert report(http, [add(3)])["committed_snapshot_version"] == token  # deltas join the committed generation
    assert hosts(http, [1, 2, 3]) == {HOST: 3}
    for _ in range(10):  # 10 s later, heartbeats keeping the reporter alive
        clock.advance(1)
        report(http, [HEARTBEAT])
    limited = report(http, [snapshot(1)])
    assert code(limited) == "SNAPSHOT_RATE_LIMITED" and limited["item_results"] == ["SNAPSHOT_RATE_LIMITED"]
    assert limited["retry_after_ms"] == "20000" and hosts(http, [1, 2, 3]) == {HOST: 3}
    clock.advance(20)
    assert code(report(http, [REGISTER, snapshot()])) == "OK"  # blocks=[]: the reporter holds nothing
    assert hosts(http, [1]) == {}

    runtime.reporter_liveness.event_report_liveness()
    assert all(runtime.reporters.locations("e1", k) == [] for k in (1, 2, 3))


def test_l1p5_and_l2_of_one_host_are_separate_reporters(http, er, runtime):
    report(http, [add(1), add(2)], storage_type=L1)
    report(http, [add(1)], storage_type=L2)
    assert hosts(http, [1, 2]) == {HOST: 2}  # aggregated per host
    report(http, [HOST_DOWN], storage_type=L1)
    assert hosts(http, [1, 2]) == {HOST: 1}
    report(http, [delete(1)], storage_type=L2)
    assert hosts(http, [1]) == {}


# ---------------------------------------------------------------- request rules


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"instance_id": "", "host_ip_port": HOST, "storage_type": L1, "events": [HEARTBEAT]}, "INSTANCE_NOT_EXIST"),
        ({"instance_id": "nope", "host_ip_port": "", "storage_type": L1, "events": [HEARTBEAT]}, "INSTANCE_NOT_EXIST"),
        ({"instance_id": "e1", "host_ip_port": "", "storage_type": L1, "events": [HEARTBEAT]}, "INVALID_ARGUMENT"),
        ({"instance_id": "e1", "host_ip_port": "a#b:1", "storage_type": "ST_NFS", "events": []}, "INVALID_ARGUMENT"),
        ({"instance_id": "e1", "host_ip_port": HOST, "storage_type": "ST_NFS", "events": []}, "OK"),
        ({"instance_id": "e1", "host_ip_port": HOST, "events": [HEARTBEAT]}, "INVALID_ARGUMENT"),
        (
            {"instance_id": "e1", "host_ip_port": HOST, "storage_type": "ST_NFS", "events": [HEARTBEAT]},
            "INVALID_ARGUMENT",
        ),
        ({"instance_id": "e2", "host_ip_port": HOST, "storage_type": L2, "events": [HEARTBEAT]}, "INSTANCE_NOT_EXIST"),
        (
            {"instance_id": "e1", "host_ip_port": HOST, "storage_type": L1, "events": [snapshot(1), snapshot(2)]},
            "INVALID_ARGUMENT",
        ),
        (
            {"instance_id": "e1", "host_ip_port": HOST, "storage_type": L1, "events": [snapshot(1), add(2)]},
            "INVALID_ARGUMENT",
        ),
        (
            {"instance_id": "e1", "host_ip_port": HOST, "storage_type": L1, "events": [delete(2), snapshot(1)]},
            "INVALID_ARGUMENT",
        ),
        (
            {"instance_id": "e1", "host_ip_port": HOST, "storage_type": L1, "events": [HOST_DOWN, HEARTBEAT]},
            "INVALID_ARGUMENT",
        ),
        (
            {"instance_id": "e2", "host_ip_port": HOST, "storage_type": L2, "events": [snapshot(1), add(2)]},
            "INSTANCE_NOT_EXIST",
        ),  # rule 4 before rule 5
    ],
    ids=[
        "no-instance",
        "unknown-instance-before-host",
        "no-host",
        "bad-host-before-empty-events",
        "empty-events-before-storage-type",
        "no-storage-type",
        "not-an-event-report-type",
        "no-backend-in-group",
        "two-snapshots",
        "snapshot-and-add",
        "delete-and-snapshot",
        "host-down-not-alone",
        "backend-before-shape",
    ],
)
def test_request_rules_in_order_change_nothing(http, er, valkey, body, expected):
    report(http, [add(9)], host="10.9.9.9:1")  # some state a refused request must leave alone
    before = reported_state(valkey)
    resp = http("reportEvent", body)
    assert code(resp) == expected, resp
    assert resp["item_results"] == [] and resp["committed_snapshot_version"] == ""
    assert reported_state(valkey) == before


BAD_ITEMS = {
    "payload-of-another-type": {"event_type": "EVENT_HEARTBEAT", "node_register": {}},
    "no-payload": {"event_type": "EVENT_HEARTBEAT"},
    "unspecified-type": {"event_type": "EVENT_UNSPECIFIED", "heartbeat": {}},
    "block-key-not-int64": add("12a"),
    "block-key-too-large": add(str(2**63)),
    "medium-with-hash": add(1, medium="g#pu"),
    "empty-medium": add(1, medium=""),
    "no-specs": {"event_type": "EVENT_BLOCK_ADD", "block_add": {"block_key": "1", "medium": "gpu", "specs": []}},
    "duplicate-spec-names": {
        "event_type": "EVENT_BLOCK_ADD",
        "block_add": {
            "block_key": "1",
            "medium": "gpu",
            "specs": [{"name": "a", "uri": "x://h/1"}, {"name": "a", "uri": "x://h/2"}],
        },
    },
    "empty-spec-name": add(1, **{"": "x://h/1"}),
    "uri-not-a-uri": add(1, full_0="not a uri"),
    "uri-with-s_version": add(1, full_0="x://h/1?s_version=0123456789abcdef0123456789abcdef"),
    "delete-without-spec-names": delete(1, names=[]),
    "delete-duplicate-spec-names": delete(1, names=["a", "a"]),
    "snapshot-duplicate-block": snapshot(1, 1),
    "register-medium-with-hash": {"event_type": "EVENT_NODE_REGISTER", "node_register": {"mediums": ["a#b"]}},
}


@pytest.mark.parametrize("item", BAD_ITEMS.values(), ids=BAD_ITEMS.keys())
def test_an_invalid_item_fails_alone_and_changes_nothing(http, er, valkey, item):
    report(http, [add(9)], host="10.9.9.9:1")
    before = reported_state(valkey)
    resp = report(http, [item])
    assert code(resp) == "INVALID_ARGUMENT" and resp["item_results"] == ["INVALID_ARGUMENT"]
    assert reported_state(valkey) == before
    mixed = report(http, [REGISTER, item, HEARTBEAT])
    assert mixed["item_results"] == ["OK", "INVALID_ARGUMENT", "OK"] and code(mixed) == "INVALID_ARGUMENT"


def test_an_empty_request_touches_no_reporter(http, er, valkey):
    resp = report(http, [])
    assert code(resp) == "OK" and resp["snapshot_required"] is False and resp["committed_snapshot_version"] == ""
    assert resp["extra_info"] == '{"zone":"a"}' and reported_state(valkey) == {}


def test_two_payloads_in_one_event_are_refused_whole(http, er, valkey):
    resp = report(http, [{"event_type": "EVENT_HEARTBEAT", "heartbeat": {}, "host_down": {}}])
    assert code(resp) == "INVALID_ARGUMENT" and reported_state(valkey) == {}


# ---------------------------------------------------------------- getHostCacheState


def test_host_prefix_stops_at_each_hosts_first_miss(http, er):
    report(http, [add(k) for k in (1, 2, 3, 4)])
    report(http, [add(k) for k in (1, 2, 4)], host=HOST2)
    report(http, [add(k) for k in (2, 3)], host="10.0.0.7:1")  # lacks key 1: no prefix
    resp = http(
        "getHostCacheState", {"instance_id": "e1", "query_type": "QT_PREFIX_MATCH", "block_cache_keys": [1, 2, 3, 4, 5]}
    )
    assert resp["hosts"] == [
        {"host_ip_port": HOST, "prefix_match_blocks": "4", "local": "4", "p2p_1_total_match": "4"},
        {"host_ip_port": HOST2, "prefix_match_blocks": "2", "local": "2", "p2p_1_total_match": "2"},
    ]


def test_mamba_prefix_ends_on_a_block_with_state(http, er):
    full = "event_report://h/f"
    both = {"full_0": full, "linear_0": "event_report://h/l"}
    report(http, [add(1, **both), add(2, full_0=full), add(3, **both), add(4, full_0=full), add(5)])
    body = {"instance_id": "e1", "query_type": "QT_PREFIX_MATCH_WITH_MAMBA", "block_cache_keys": [1, 2, 3, 4, 5, 6]}
    assert [(h["host_ip_port"], h["local"]) for h in http("getHostCacheState", body)["hosts"]] == [(HOST, "3")]


def test_eagle_pop_takes_one_block_off(http, er):
    resp = http(
        "registerInstance",
        {
            "instance_group": "ger",
            "instance_id": "eagle",
            "block_size": 4,
            "location_spec_infos": ER_SPECS,
            "model_deployment": {"model_name": "m", "dtype": "fp16", "use_eagle_pop": True},
            "location_spec_groups": [
                {"name": "F0", "spec_names": ["full_0"]},
                {"name": "L0", "spec_names": ["linear_0"]},
            ],
            "default_query_type": "QT_PREFIX_MATCH_WITH_MAMBA",
        },
    )
    assert code(resp) == "OK", resp
    both = {"full_0": "event_report://h/f", "linear_0": "event_report://h/l"}
    report(http, [add(1, **both), add(2, **both), add(3, **both)], instance="eagle")
    report(http, [add(1, **both)], instance="eagle", host=HOST2)
    # default_query_type (Mamba) applies; the last block is popped; HOST2's 1 becomes 0.
    resp = http("getHostCacheState", {"instance_id": "eagle", "block_cache_keys": [1, 2, 3]})
    assert [(h["host_ip_port"], h["local"]) for h in resp["hosts"]] == [(HOST, "2")]
    info = http("getInstanceInfo", {"instance_id": "eagle"})["instance_info"]
    assert info["default_query_type"] == "QT_PREFIX_MATCH_WITH_MAMBA" and info["model_deployment"]["use_eagle_pop"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"block_cache_keys": [1], "query_type": "QT_PREFIX_MATCH"}, "instance_id"),
        ({"instance_id": "e1", "query_type": "QT_PREFIX_MATCH"}, "block_cache_keys"),
        ({"instance_id": "e1", "block_cache_keys": [1], "query_type": "QT_BATCH_GET"}, "query_type"),
    ],
)
def test_host_state_refuses_bad_requests(http, er, body, field):
    resp = http("getHostCacheState", body)
    assert code(resp) == "INVALID_ARGUMENT" and field in resp["header"]["status"]["message"]


def test_mamba_needs_full_and_state_groups(http, er, instance):
    resp = http(
        "getHostCacheState",
        {"instance_id": instance, "block_cache_keys": [1], "query_type": "QT_PREFIX_MATCH_WITH_MAMBA"},
    )
    assert code(resp) == "INVALID_ARGUMENT"


def test_fast_and_record_paths_agree(http, er):
    """Without a medium filter and with no retired generation the prefixes come from the
    reporters' key sets; with one, from the records: same answer, across run boundaries."""
    import random

    rng = random.Random(7)
    keys = rng.sample(range(1, 1 << 40), 300)
    for h in range(6):
        held = keys[: rng.choice([0, 1, 63, 64, 65, 190, 300])]
        gap = [k for k in held if rng.random() < 0.01]  # holes: the prefix stops at the first
        events = [add(k) for k in held if k not in gap]
        for start in range(0, len(events), 100):
            report(http, events[start : start + 100], host=f"10.1.0.{h}:1", storage_type=L1 if h % 2 else L2)
    fast = hosts(http, keys)
    assert fast == hosts(http, keys, medium=["gpu", "mem"]) and len(fast) >= 3


def test_event_report_metrics_per_event_type(http, er, runtime):
    from chalice.test import Client

    import app

    report(http, [REGISTER, add(1), {"event_type": "EVENT_HEARTBEAT"}])
    with Client(app.app) as chalice:
        text = chalice.http.get("/metrics").body.decode()
    lines = [line for line in text.splitlines() if line.startswith("kvcm_event_report_")]
    assert any(
        "request_counter" in line
        and 'event_type="EVENT_BLOCK_ADD"' in line
        and 'type="event_report_l1p5"' in line
        and 'instance_group="ger"' in line
        for line in lines
    ), lines
    assert any("error_counter" in line and 'event_type="EVENT_HEARTBEAT"' in line for line in lines), lines
    assert any(line.startswith("kvcm_event_report_request_rt_us") for line in lines), lines


def test_a_removed_instances_reports_go_with_its_removal(http, er, runtime, valkey):
    report(http, [add(1), add(2)])
    assert reported_state(valkey) != {}
    assert code(http("removeInstance", {"instance_group": "ger", "instance_id": "e1"})) == "OK"
    assert reported_state(valkey) == {} and runtime.reporters.instances() == []  # no liveness run needed


def test_reports_of_an_instance_gone_otherwise_go_with_the_liveness_job(http, er, runtime, valkey):
    report(http, [add(1), add(2)])
    runtime.control.begin_instance_removal("e1")  # a removal whose purge never ran
    runtime.reporter_liveness.event_report_liveness()
    assert reported_state(valkey) == {} and runtime.reporters.instances() == []


def test_reports_of_the_layout_before_records_are_dropped_and_a_snapshot_asked(http, er, runtime, valkey):
    """An instance upgraded from the layout of one ``T:er:loc`` hash (and a key set per
    reporter): the liveness job deletes those keys, which no reader looks at, and retires
    each reporter's generation, so its next report asks for the snapshot that re-sends them."""
    assert report(http, [REGISTER, add(1), add(2)])["snapshot_required"] is True
    report(http, [add(1)], host=HOST2)
    assert report(http, [add(3)])["snapshot_required"] is False
    tag = runtime.reporters.node_key("e1", "x").partition(":er:")[0]
    legacy = [f"{tag}:er:loc", f"{tag}:er:k:l1p5#{HOST}", f"{tag}:er:k:l1p5#{HOST2}"]
    valkey.hset(legacy[0], mapping={"1": b"\x91\x93", "2": b"\x91\x93"})
    for key in legacy[1:]:
        valkey.sadd(key, "1")

    done = runtime.reporter_liveness.event_report_liveness()
    assert done["locations_cleaned"] == 4 and not any(valkey.exists(key) for key in legacy)
    assert hosts(http, [1, 2, 3]) == {}
    again = report(http, [HEARTBEAT])
    assert code(again) == "OK" and again["snapshot_required"] is True
    assert code(report(http, [snapshot(1, 2)])) == "OK"
    assert report(http, [HEARTBEAT])["snapshot_required"] is False
    assert hosts(http, [1, 2, 3]) == {HOST: 2}
    state = reported_state(valkey)
    assert runtime.reporter_liveness.event_report_liveness()["locations_cleaned"] == 0
    assert reported_state(valkey) == state  # once upgraded, nothing more to do
