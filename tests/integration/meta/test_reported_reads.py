"""getCacheLocation, getCacheMeta and getCacheLocationLen over stored and reported
locations (UPSTREAM_V2 §2.1 "Query visibility"; docs/api-v2.md), on real Valkey and moto."""

from __future__ import annotations

import json

import pytest

from .harness import HEARTBEAT, HOST, HOST2, add, code, report, write

L1P5 = "ST_EVENT_REPORT_L1P5"


def locate(http, keys, query_type="QT_PREFIX_MATCH", instance="e1", **extra):
    resp = http("getCacheLocation", {"instance_id": instance, "query_type": query_type, "block_keys": keys, **extra})
    assert code(resp) == "OK", resp
    return resp["locations"]


def kinds(locations) -> list[str]:
    """Per location: its type, '-' for a miss (no URI)."""
    return [loc["type"] if any(s["uri"] for s in loc["location_specs"]) else "-" for loc in locations]


@pytest.fixture
def mixed(http, request):
    """e1 holds keys 1, 2, 4 in storage and 3 reported by HOST (2 specs), 1 reported too."""
    request.getfixturevalue("er")
    write(http, [1, 2], instance="e1")
    write(http, [4], instance="e1")
    first = report(
        http,
        [add(3, full_0="event_report://10.0.0.8:9600/gpu/3", linear_0="event_report://10.0.0.8:9600/gpu/3l"), add(1)],
    )
    return first["committed_snapshot_version"]


def test_prefix_match_counts_a_key_held_stored_or_reported(http, mixed):
    found = locate(http, [1, 2, 3, 4, 5])
    assert kinds(found) == ["ST_NFS", "ST_NFS", L1P5, "ST_NFS"]
    reported = found[2]
    assert reported["spec_size"] == 2 and {s["name"]: s["uri"] for s in reported["location_specs"]} == {
        "full_0": f"event_report://10.0.0.8:9600/gpu/3?s_version={mixed}",
        "linear_0": f"event_report://10.0.0.8:9600/gpu/3l?s_version={mixed}",
    }
    assert kinds(locate(http, [3, 1, 5, 2])) == [L1P5, "ST_NFS"]
    assert kinds(locate(http, [5, 3])) == []
    masked = locate(http, [9, 3, 4], block_mask={"offset": 1})
    assert kinds(masked) == [L1P5, "ST_NFS"]


def test_a_key_stored_and_reported_is_served_from_storage(http, mixed):
    assert kinds(locate(http, [1], "QT_BATCH_GET")) == ["ST_NFS"]


def test_batch_get_fills_misses_with_reported_locations(http, mixed):
    assert kinds(locate(http, [1, 3, 9, 4], "QT_BATCH_GET")) == ["ST_NFS", L1P5, "-", "ST_NFS"]
    for query_type, keys, expected in (("QT_BATCH_GET", [1, 3, 9, 4], 3), ("QT_PREFIX_MATCH", [1, 2, 3, 4], 4)):
        length = http("getCacheLocationLen", {"instance_id": "e1", "query_type": query_type, "block_keys": keys})
        assert int(length["cache_location_len"]) == expected


def test_sliding_window_runs_over_reported_keys(http, mixed):
    # hits 1 2 3 . 4: the right-most run of 2 is (2, 3); 4 is stored but outside every run.
    window = locate(http, [1, 2, 3, 9, 4], "QT_REVERSE_ROLL_SW_MATCH", sw_size=2)
    assert kinds(window) == ["-", "ST_NFS", L1P5, "-", "-"]
    assert kinds(locate(http, [9, 2, 3, 4], "QT_REVERSE_ROLL_SW_MATCH", sw_size=3)) == ["-", "ST_NFS", L1P5, "ST_NFS"]
    assert kinds(locate(http, [3, 9, 9], "QT_REVERSE_ROLL_SW_MATCH", sw_size=2)) == ["-", "-", "-"]


@pytest.mark.usefixtures("er")
def test_spec_filter_applies_to_reported_locations(http):
    report(
        http, [add(7, full_0="event_report://h/7"), add(8, full_0="event_report://h/8", linear_0="event_report://h/8l")]
    )
    assert kinds(locate(http, [8, 7], "QT_BATCH_GET", location_spec_names=["linear_0"])) == [L1P5, "-"]
    [only] = locate(http, [8], location_spec_names=["linear_0"])
    assert [s["name"] for s in only["location_specs"]] == ["linear_0"] and only["spec_size"] == 1


def test_hidden_reporters_are_not_served(http, mixed, clock):
    report(http, [add(5)], host=HOST2)
    clock.advance(1.5)  # both past the 1 s heartbeat timeout
    assert kinds(locate(http, [1, 2, 3, 4])) == ["ST_NFS", "ST_NFS"]
    report(http, [HEARTBEAT])  # HOST is back within its grace; HOST2 stays hidden
    assert kinds(locate(http, [1, 2, 3, 4, 5], "QT_BATCH_GET")) == ["ST_NFS", "ST_NFS", L1P5, "ST_NFS", "-"]


def test_cache_meta_shows_reported_locations_with_upstreams_id(http, mixed):
    resp = http("getCacheMeta", {"instance_id": "e1", "block_keys": [1, 3, 9]})
    assert code(resp) == "OK", resp
    metas = [json.loads(m) for m in resp["metas"]]
    assert metas[0]["status"] == "CLS_SERVING" and metas[0]["id"].isdigit()
    assert metas[1] == {"id": f"kvs#event_report_l1p5#gpu#{HOST}", "status": "CLS_SERVING"}
    assert metas[2] == {"id": "", "status": "CLS_NOT_FOUND"}
    assert kinds(resp["locations"]) == ["ST_NFS", L1P5, "-"]


def test_a_group_without_event_report_storage_never_reads_reports(http, instance, runtime, monkeypatch):
    write(http, [1, 2])

    def refuse(*args, **kwargs):
        raise AssertionError("the reported locations were read")

    monkeypatch.setattr(runtime.reporters, "visible_locations", refuse)
    assert len(locate(http, [1, 2, 3], instance="i1")) == 2
    assert code(http("getCacheMeta", {"instance_id": "i1", "block_keys": [1, 3]})) == "OK"
