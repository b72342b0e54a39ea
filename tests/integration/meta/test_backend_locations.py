"""getCacheLocationsByBackend on real Valkey and moto (UPSTREAM_V2 §2.5)."""

from __future__ import annotations

import pytest

from .harness import HOST2, L1, L2, add, code, report


def by_backend(http, keys, selectors, **extra):
    return http(
        "getCacheLocationsByBackend",
        {
            "instance_id": "e1",
            "query_type": "QT_BATCH_GET",
            "block_keys": keys,
            "backend_selectors": selectors,
            **extra,
        },
    )


def uris(vector):
    return [
        [s["uri"].split("?s_version=")[0].split("&s_version=")[0] for s in loc["location_specs"]]
        for loc in vector["locations"]
    ]


def test_v6d_prefix_and_coverage_choose_one_l2_peer(http, er):
    a, b = "vineyard://10.10.0.1:9600", "vineyard://10.10.0.2:9600"
    report(http, [add(1, full_0=f"{a}/1"), add(2, full_0=f"{a}/2")], storage_type=L2)
    report(
        http, [add(1, full_0=f"{b}/1"), add(3, full_0=f"{b}/3"), add(4, full_0=f"{b}/4")], storage_type=L2, host=HOST2
    )
    prefix = by_backend(http, [1, 2, 3, 4], [{"backend_type": L2, "strategy": "LSS_V6D_PREFIX"}])
    assert code(prefix) == "OK"
    assert [uris(v) for v in prefix["key_locations"]] == [[[f"{a}/1"]], [[f"{a}/2"]], [], []]
    coverage = by_backend(http, [1, 2, 3, 4], [{"backend_type": L2, "strategy": "LSS_V6D_COVERAGE"}])
    assert [uris(v) for v in coverage["key_locations"]] == [[[f"{b}/1"]], [], [[f"{b}/3"]], [[f"{b}/4"]]]
    location = coverage["key_locations"][0]["locations"][0]
    assert location["type"] == L2 and location["spec_size"] == 1
    assert "s_version=" in location["location_specs"][0]["uri"]


def test_spec_names_filter_before_the_peer_is_chosen(http, er):
    full, linear = "vineyard://10.10.0.1:9600", "vineyard://10.10.0.2:9600"
    report(http, [add(1, full_0=f"{full}/1"), add(2, full_0=f"{full}/2")], storage_type=L2)
    report(http, [add(1, linear_0=f"{linear}/1")], storage_type=L2, host=HOST2)
    resp = by_backend(
        http, [1, 2], [{"backend_type": L2, "strategy": "LSS_V6D_PREFIX"}], location_spec_names=["linear_0", "linear_0"]
    )
    assert [uris(v) for v in resp["key_locations"]] == [[[f"{linear}/1"]], []]


def test_one_location_per_backend_type_stored_and_reported(http, er):
    resp = http("startWriteCache", {"instance_id": "e1", "block_keys": [1, 2]})
    http(
        "finishWriteCache",
        {"instance_id": "e1", "write_session_id": resp["write_session_id"], "success_blocks": {"offset": 2}},
    )
    report(http, [add(2, full_0="event_report://10.0.0.8:9600/gpu/2", linear_0="event_report://10.0.0.8:9600/l/2")])
    resp = by_backend(
        http,
        [1, 2, 3],
        [
            {"backend_type": "ST_NFS", "strategy": "LSS_WEIGHTED_RANDOM"},
            {"backend_type": L1, "strategy": "LSS_WEIGHTED_RANDOM"},
        ],
        block_mask={"bool_masks": {"values": [False, False, False]}},
    )
    assert code(resp) == "OK"
    types = [[loc["type"] for loc in v["locations"]] for v in resp["key_locations"]]
    assert types == [["ST_NFS"], ["ST_NFS", L1], []]
    assert resp["key_locations"][1]["locations"][1]["spec_size"] == 2


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"query_type": "QT_PREFIX_MATCH"}, "query_type"),
        ({"backend_selectors": []}, "backend_selectors"),
        (
            {
                "backend_selectors": [
                    {"backend_type": L1, "strategy": "LSS_WEIGHTED_RANDOM"},
                    {"backend_type": L1, "strategy": "LSS_WEIGHTED_RANDOM"},
                ]
            },
            "backend_type",
        ),
        ({"backend_selectors": [{"backend_type": L1, "strategy": "LSS_V6D_PREFIX"}]}, "strategy"),
        ({"backend_selectors": [{"backend_type": L2}]}, "strategy"),
        ({"backend_selectors": [{"backend_type": 263, "strategy": "LSS_WEIGHTED_RANDOM"}]}, "backend_type"),
        ({"location_spec_names": ["full_0"]}, "location_spec_names"),
        ({"block_mask": {"bool_masks": {"values": [True]}}}, "block_mask"),
    ],
)
def test_bad_requests_name_the_field(http, er, extra, field):
    body = {
        "instance_id": "e1",
        "query_type": "QT_BATCH_GET",
        "block_keys": [1, 2],
        "backend_selectors": [{"backend_type": L2, "strategy": "LSS_V6D_PREFIX"}],
        **extra,
    }
    resp = http("getCacheLocationsByBackend", body)
    assert code(resp) == "INVALID_ARGUMENT" and field in resp["header"]["status"]["message"], resp
    assert resp["key_locations"] == []
