"""getCacheMeta's ``replica_locations`` and getCacheMetaDetail (upstream's newest meta
service, issue 22 item 7; docs/api-v2.md): every copy of a key with its id, status,
creation time and per-spec URI, on real Valkey and moto through the app."""

from __future__ import annotations

import json

import pytest

from .harness import HOST, HOST2, add, code, report, write
from .test_read_answer_bounds import _fit, wide  # noqa: F401 (fixture)
from .test_write_replicas import finish, start, two_storages  # noqa: F401 (fixture)

L1P5 = "ST_EVENT_REPORT_L1P5"


def meta(http, keys, instance="r1", **extra):
    resp = http("getCacheMeta", {"instance_id": instance, "block_keys": keys, **extra})
    assert code(resp) == "OK", resp
    return resp


def detail(http, keys, instance="r1", **extra):
    resp = http("getCacheMetaDetail", {"instance_id": instance, "block_keys": keys, **extra})
    assert code(resp) == "OK", resp
    return resp


def uris(location) -> list[str]:
    return [s["uri"] for s in location["location_specs"]]


@pytest.mark.usefixtures("two_storages")
def test_every_copy_is_listed_with_its_id_status_time_and_uris(http):
    first = start(http, [1])
    finish(http, first)
    second = start(http, [1], min_replica_count=2)  # a second copy, on nfs_b, still WRITING
    resp = meta(http, [1])
    [entry] = resp["replica_locations"]
    copies = entry["locations"]
    assert [c["status"] for c in copies] == ["CLS_SERVING", "CLS_WRITING"]
    assert len({c["id"] for c in copies}) == 2 and all(c["id"].isdigit() for c in copies)
    assert all(int(c["create_time"]) > 0 and isinstance(c["create_time"], str) for c in copies)
    assert copies[0]["create_time"] == copies[1]["create_time"]  # the record's time (docs/api-v2.md)
    assert [uris(c) for c in copies] == [uris(first["locations"][0]), uris(second["locations"][0])]
    assert all(c["type"] == "ST_NFS" and c["spec_size"] == 2 for c in copies)
    assert all(s["node_id"] == "" for c in copies for s in c["location_specs"])
    # the older fields still hold the first (serving) copy
    assert json.loads(resp["metas"][0]) == {"id": copies[0]["id"], "status": "CLS_SERVING"}
    assert uris(resp["locations"][0]) == uris(copies[0])

    finish(http, second)
    published = meta(http, [1])["replica_locations"][0]["locations"]
    assert [c["id"] for c in published] == [c["id"] for c in copies]
    assert {c["status"] for c in published} == {"CLS_SERVING"}


@pytest.mark.usefixtures("two_storages")
def test_detail_lists_the_same_copies_under_upstreams_detail_names(http):
    finish(http, start(http, [1, 2]))
    finish(http, start(http, [2], min_replica_count=2))
    replicas = meta(http, [2])["replica_locations"][0]["locations"]
    resp = detail(http, [1, 2])
    first, second = resp["items"]
    assert (first["request_index"], first["block_key"], first["prev_block_key"]) == (0, "1", "")
    assert (second["request_index"], second["block_key"], second["prev_block_key"]) == (1, "2", "1")
    assert second["properties"]["BP#prev_key"] == "1" and "BP#prev_key" not in first["properties"]
    assert int(second["properties"]["write_time_ms"]) > 0
    assert second["status"] == {"code": "OK", "message": ""}
    assert [(c["location_id"], c["status"], c["create_time"], uris(c)) for c in second["locations"]] == [
        (r["id"], r["status"], r["create_time"], uris(r)) for r in replicas
    ]
    assert len(second["locations"]) == 2


@pytest.mark.usefixtures("two_storages")
def test_missing_and_masked_keys(http):
    finish(http, start(http, [1]))
    resp = meta(http, [9, 1, 8], block_mask={"bool_masks": {"values": [False, False, True]}})
    assert [len(e["locations"]) for e in resp["replica_locations"]] == [0, 1]
    assert [json.loads(m)["status"] for m in resp["metas"]] == ["CLS_NOT_FOUND", "CLS_SERVING"]
    items = detail(http, [9, 1, 8], block_mask={"offset": 1})["items"]
    assert [(i["request_index"], i["block_key"], len(i["locations"])) for i in items] == [(1, "1", 1), (2, "8", 0)]
    assert items[1]["properties"] == {} and items[1]["status"]["code"] == "OK"


@pytest.mark.usefixtures("er")
def test_reported_copies_follow_the_stored_one(http):
    write(http, [1], instance="e1")
    token = report(http, [add(1, full_0="event_report://10.0.0.8:9600/gpu/1")])["committed_snapshot_version"]
    report(http, [add(1, medium="disk", full_0="event_report://10.0.0.9:9600/disk/1")], host=HOST2)
    copies = meta(http, [1], instance="e1")["replica_locations"][0]["locations"]
    assert [c["type"] for c in copies] == ["ST_NFS", L1P5, L1P5]
    assert [c["id"] for c in copies[1:]] == [f"kvs#event_report_l1p5#gpu#{HOST}", f"kvs#event_report_l1p5#disk#{HOST2}"]
    assert all(c["status"] == "CLS_SERVING" and c["create_time"] == "0" for c in copies[1:])
    assert copies[1]["location_specs"] == [
        {"name": "full_0", "uri": f"event_report://10.0.0.8:9600/gpu/1?s_version={token}", "node_id": ""}
    ]
    [item] = detail(http, [1], instance="e1")["items"]
    assert [c["location_id"] for c in item["locations"]] == [c["id"] for c in copies]


@pytest.mark.usefixtures("two_storages")
@pytest.mark.parametrize("method", ["getCacheMeta", "getCacheMetaDetail"])
def test_bad_input_names_the_field(http, method):
    cases = [
        ({"block_keys": [1]}, "INVALID_ARGUMENT", "instance_id"),
        ({"instance_id": "nope", "block_keys": [1]}, "INSTANCE_NOT_EXIST", "nope"),
        ({"instance_id": "r1"}, "INVALID_ARGUMENT", "block_keys"),
        ({"instance_id": "r1", "block_keys": ["x"]}, "INVALID_ARGUMENT", "block_keys"),
        (
            {"instance_id": "r1", "block_keys": [1], "block_mask": {"bool_masks": {"values": [True, False]}}},
            "INVALID_ARGUMENT",
            "block_mask",
        ),
        ({"instance_id": "r1", "block_keys": [1], "block_mask": {"offset": -1}}, "INVALID_ARGUMENT", "offset"),
        ({"instance_id": "r1", "block_keys": [1], "detail_level": "high"}, "INVALID_ARGUMENT", "detail_level"),
    ]
    for body, expected, named in cases:
        resp = http(method, body)
        assert code(resp) == expected, (body, resp)
        assert named in resp["header"]["status"]["message"], (body, resp)


@pytest.mark.usefixtures("wide")
def test_detail_is_bounded_like_the_other_reads(http):
    resp = http("getCacheMetaDetail", {"instance_id": "wide", "block_keys": list(range(1, 2001))})
    fit = _fit(resp, "block_keys", "keys")
    assert code(http("getCacheMetaDetail", {"instance_id": "wide", "block_keys": list(range(1, fit + 2))})) != "OK"
    answered = http("getCacheMetaDetail", {"instance_id": "wide", "block_keys": list(range(1, fit + 1))})
    assert code(answered) == "OK", answered["header"]
    assert len(answered["items"]) == fit and len(answered["items"][6]["locations"]) == 1


@pytest.mark.usefixtures("wide")
def test_replicas_count_in_get_cache_meta_bound(http):
    keys = list(range(1, 2001))
    located = http("getCacheLocation", {"instance_id": "wide", "query_type": "QT_BATCH_GET", "block_keys": keys})
    location_fit = _fit(located, "block_keys", "keys")
    fit = _fit(http("getCacheMeta", {"instance_id": "wide", "block_keys": list(range(1, 2001))}), "block_keys", "keys")
    assert fit <= location_fit // 2  # each key's location shows twice: first copy and replica
    answered = http("getCacheMeta", {"instance_id": "wide", "block_keys": list(range(1, fit + 1))})
    assert code(answered) == "OK", answered["header"]
    assert len(answered["replica_locations"]) == fit and len(answered["replica_locations"][6]["locations"]) == 1


@pytest.mark.usefixtures("er")
def test_reported_copies_past_the_bound_are_refused_after_the_read(http):
    # Engines' URIs are not bounded by the instance's layout: 600 keys held by 3 hosts with
    # 4 KB URIs make a 7+ MB answer the estimate before the read cannot see.
    keys = list(range(1, 601))
    long = "x" * 4000
    for host in (HOST, HOST2, "10.0.0.10:8080"):
        for batch in range(0, len(keys), 200):
            events = [add(k, full_0=f"event_report://{host}/gpu/{k}/{long}") for k in keys[batch : batch + 200]]
            resp = report(http, events, host=host)
            assert code(resp) == "OK", resp["header"]
    resp = http("getCacheMeta", {"instance_id": "e1", "block_keys": keys})
    fit = _fit(resp, "block_keys", "keys")
    assert 300 < fit < 600
    answered = http("getCacheMeta", {"instance_id": "e1", "block_keys": keys[:fit]})
    assert code(answered) == "OK", answered["header"]
    assert all(len(e["locations"]) == 3 for e in answered["replica_locations"])


@pytest.mark.usefixtures("two_storages")
def test_copies_on_a_disabled_or_removed_storage_are_still_listed(http, runtime):
    finish(http, start(http, [1]))
    finish(http, start(http, [1], min_replica_count=2))
    assert code(http("disableStorage", {"storage_unique_name": "nfs_b"})) == "OK"
    runtime.config.invalidate()
    copies = meta(http, [1])["replica_locations"][0]["locations"]
    assert [(c["type"], bool(uris(c)[0])) for c in copies] == [("ST_NFS", True), ("ST_NFS", True)]
    group = runtime.control.get_group("g2")
    current, group.version, group.storage_candidates = group.version, 0, ["nfs_a"]
    runtime.control.update_group(group, current)
    runtime.control.remove_storage("nfs_b")
    runtime.config.invalidate()
    gone = meta(http, [1])["replica_locations"][0]["locations"]
    assert [c["id"] for c in gone] == [c["id"] for c in copies]
    assert gone[1]["type"] == "ST_UNSPECIFIED" and gone[1]["location_specs"] == [] and gone[1]["spec_size"] == 0
    [item] = detail(http, [1])["items"]
    assert [(c["location_id"], c["type"]) for c in item["locations"]] == [(c["id"], c["type"]) for c in gone]
