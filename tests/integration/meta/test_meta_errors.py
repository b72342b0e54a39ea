"""Bad input and refusals on the meta API: the contract's code, a message naming the
field, HTTP 200 (400 only for a body that is not a JSON object), nothing half-written."""

import json

import pytest

from chalicelib.protocol.models import InstanceGroup

from .harness import SPECS, code, write

METHODS = [
    "registerInstance",
    "getInstanceInfo",
    "getCacheLocation",
    "getCacheMeta",
    "getCacheMetaDetail",
    "startWriteCache",
    "finishWriteCache",
    "removeCache",
    "trimCache",
]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("body", ["not json", "[1, 2]", '"text"', "{", '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"])
def test_body_not_a_json_object(http, instance, method, body):
    assert http(method, body) == {}
    assert http.status == 400


@pytest.mark.parametrize(
    "method,body,field",
    [
        ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH", "block_keys": "abc"}, "block_keys"),
        ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH", "block_keys": [1, "x"]}, "block_keys[1]"),
        ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH", "block_keys": [True]}, "block_keys[0]"),
        ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH", "block_keys": [2**64]}, "block_keys[0]"),
        ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH", "block_keys": [5, -(2**63) - 1]}, "block_keys[1]"),
        ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH", "token_ids": [1, 2, 2.5]}, "token_ids[2]"),
        ("getCacheLocation", {"query_type": "NOPE", "block_keys": [1]}, "query_type"),
        ("getCacheLocation", {"query_type": 77, "block_keys": [1]}, "query_type"),
        ("getCacheLocation", {"block_keys": [1]}, "query_type"),
        ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH"}, "block_keys"),
        ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH", "block_keys": []}, "block_keys"),
        ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH", "token_ids": [1, 2]}, "token_ids"),
        (
            "getCacheLocation",
            {"query_type": "QT_PREFIX_MATCH", "block_keys": [1, 2], "block_mask": {"bool_masks": {"values": [True]}}},
            "block_mask.bool_masks.values",
        ),
        (
            "getCacheLocation",
            {"query_type": "QT_PREFIX_MATCH", "block_keys": [1, 2], "block_mask": {"offset": 3}},
            "block_mask.offset",
        ),
        (
            "getCacheLocation",
            {"query_type": "QT_PREFIX_MATCH", "block_keys": [1], "block_mask": {"offset": -1}},
            "block_mask",
        ),
        (
            "getCacheLocation",
            {
                "query_type": "QT_PREFIX_MATCH",
                "block_keys": [1],
                "block_mask": {"offset": 1, "bool_masks": {"values": [True]}},
            },
            "block_mask",
        ),
        (
            "getCacheLocation",
            {"query_type": "QT_BATCH_GET", "block_keys": [1], "location_spec_names": ["tp9"]},
            "location_spec_names",
        ),
        ("getCacheLocation", {"query_type": "QT_REVERSE_ROLL_SW_MATCH", "block_keys": [1]}, "sw_size"),
        ("getCacheLocation", {"query_type": "QT_BATCH_GET", "block_keys": [1], "sw_size": "big"}, "sw_size"),
        ("startWriteCache", {"block_keys": [1, 2], "location_spec_group_names": ["g"]}, "location_spec_group_names"),
        ("startWriteCache", {"block_keys": [1], "location_spec_group_names": ["nope"]}, "location_spec_group_names"),
        ("startWriteCache", {"block_keys": [1], "write_timeout_seconds": -1}, "write_timeout_seconds"),
        ("startWriteCache", {"block_keys": [1], "write_timeout_seconds": 1.5}, "write_timeout_seconds"),
        ("finishWriteCache", {"write_session_id": "a" * 32}, "success_blocks"),
        ("finishWriteCache", {"write_session_id": "x}", "success_blocks": {"offset": 1}}, "write_session_id"),
        ("finishWriteCache", {"success_blocks": {"offset": 1}}, "write_session_id"),
        ("finishWriteCache", {"write_session_id": 5, "success_blocks": {"offset": 1}}, "write_session_id"),
        ("removeCache", {"block_keys": {"a": 1}}, "block_keys"),
        ("trimCache", {"strategy": "TS_NOPE"}, "strategy"),
        ("trimCache", {"strategy": "TS_TIMESTAMP", "begin_timestamp": 5, "end_timestamp": 1}, "begin_timestamp"),
        ("getCacheMeta", {"block_keys": [1], "block_mask": {"bool_masks": {"values": [1]}}}, "block_mask"),
        ("getCacheMetaDetail", {"block_keys": [1, 2], "block_mask": {"offset": "x"}}, "block_mask"),
        ("registerInstance", {"instance_group": "g1", "block_size": 0}, "block_size"),
        ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH", "block_keys": [1, None]}, "block_keys[1]"),
        (
            "getCacheLocation",
            {"query_type": "QT_BATCH_GET", "block_keys": [1], "location_spec_names": [None]},
            "location_spec_names[0]",
        ),
        ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH", "block_keys": ["1_0"]}, "block_keys[0]"),
        ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH", "block_keys": [" 1 "]}, "block_keys[0]"),
        ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH", "block_keys": ["+3"]}, "block_keys[0]"),
        ("getCacheLocation", {"query_type": "QT_BATCH_GET", "block_keys": [1], "sw_size": "+1"}, "sw_size"),
        ("getCacheLocation", {"query_type": "77", "block_keys": [1]}, "query_type"),
        ("trimCache", {"strategy": "TS_TIMESTAMP", "begin_timestamp": "1_0", "end_timestamp": 20}, "begin_timestamp"),
    ],
)
def test_malformed_fields_are_named(http, instance, method, body, field):
    resp = http(method, {"instance_id": "i1", **body})
    assert http.status == 200
    assert code(resp) == "INVALID_ARGUMENT", resp
    assert field in resp["header"]["status"]["message"], resp


def test_camel_case_and_string_int64_are_accepted(http, instance):
    write(http, [1, 2])
    resp = http("getCacheLocation", {"instanceId": "i1", "queryType": 2, "blockKeys": ["1", "2"], "extra": {}})
    assert code(resp) == "OK" and len(resp["locations"]) == 2


def test_null_fields_are_their_defaults(http, instance):
    write(http, [1, 2])
    resp = http(
        "getCacheLocation",
        {
            "instance_id": "i1",
            "query_type": "QT_PREFIX_MATCH",
            "block_keys": [1, 2],
            "location_spec_names": None,
            "tokenIds": None,
            "trace_id": None,
            "sw_size": None,
            "header": None,
            "block_mask": {"offset": None},
        },
    )
    assert code(resp) == "OK" and len(resp["locations"]) == 2, resp
    resp = http(
        "startWriteCache",
        {"instance_id": "i1", "block_keys": [3], "location_spec_group_names": None, "writeTimeoutSeconds": None},
    )
    assert code(resp) == "OK" and len(resp["locations"]) == 1, resp


def test_an_enum_number_may_be_a_string(http, instance):
    write(http, [1, 2])
    resp = http("getCacheLocation", {"instance_id": "i1", "query_type": "2", "block_keys": [1, 2]})
    assert code(resp) == "OK" and len(resp["locations"]) == 2, resp


@pytest.mark.parametrize(
    "method,body,defaults",
    [
        ("getCacheLocation", {"query_type": "NOPE", "block_keys": [1]}, {"locations": []}),
        ("getCacheMeta", {"block_keys": "x"}, {"locations": [], "metas": [], "replica_locations": []}),
        ("getCacheMetaDetail", {"block_keys": "x"}, {"items": []}),
        (
            "startWriteCache",
            {"block_keys": [1], "write_timeout_seconds": -1},
            {"write_session_id": "", "locations": []},
        ),
        ("registerInstance", {"instance_group": "g1", "block_size": 0}, {"storage_configs": "", "extra_info": ""}),
        ("getInstanceInfo", {"instance_id": "nope"}, {"instance_group": ""}),
        ("finishWriteCache", {"write_session_id": "x"}, {}),
        ("getMetrics", {"trace_id": {}}, {"timestamp": "0", "metrics": [], "extra_data": ""}),
    ],
)
def test_an_error_prints_the_response_defaults(http, instance, method, body, defaults):
    resp = http(method, {"instance_id": "i1", **body})
    assert http.status == 200 and code(resp) != "OK", resp
    assert set(resp["header"]) == {"status", "request_id"} and resp["header"]["status"]["message"]
    assert {name: value for name, value in resp.items() if name != "header"} == defaults


def test_an_auth_refusal_is_the_header_alone(http, instance, runtime):
    runtime.reconfigure(auth_enabled=True)
    resp = http("getCacheLocation", {"instance_id": "i1", "query_type": "QT_PREFIX_MATCH", "block_keys": [1]})
    assert http.status == 401 and list(resp) == ["header"], resp


def test_key_cap(http, instance, runtime):
    runtime.reconfigure(max_keys_per_request=4)
    resp = http("startWriteCache", {"instance_id": "i1", "block_keys": list(range(5))})
    assert code(resp) == "INVALID_ARGUMENT" and "limit of 4" in resp["header"]["status"]["message"]


def _meta_statuses(http, keys):
    resp = http("getCacheMeta", {"instance_id": "i1", "block_keys": keys})
    return [json.loads(m)["status"] for m in resp["metas"]]


def test_a_start_past_the_quota_gets_the_leading_run_that_fits_and_nothing_else(http, runtime, group):
    """Room for one more block: a start of two new keys gets the first (a partial grant,
    issue #23 item 2; it was refused whole), the other stays unwritten; a start with no
    room at all is refused and leaves nothing WRITING."""
    runtime.control.update_group(
        InstanceGroup.model_validate({**group.model_dump(), "version": 0, "quota": {"capacity": 4096}}),
        current_version=group.version,
    )
    http(
        "registerInstance",
        {
            "instance_group": "g1",
            "instance_id": "i1",
            "block_size": 4,
            "location_spec_infos": SPECS,
            "model_deployment": {"model_name": "m", "dtype": "f"},
        },
    )
    write(http, [1])  # 2 KiB of 4
    resp = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2, 3]})
    assert code(resp) == "OK", resp
    assert resp["block_mask"] == {"bool_masks": {"values": [True, False, True]}} and len(resp["locations"]) == 1
    assert _meta_statuses(http, [2, 3]) == ["CLS_WRITING", "CLS_NOT_FOUND"]
    ctx = runtime.contexts("i1")
    assert runtime.index.usage([ctx.layout])[0].bytes == 4096
    refused = http("startWriteCache", {"instance_id": "i1", "block_keys": [3]})  # 2 blocks WRITING/SERVING
    assert code(refused) == "REACH_MAX_ENTITY_CAPACITY", refused
    assert _meta_statuses(http, [3]) == ["CLS_NOT_FOUND"]
    assert runtime.index.usage([ctx.layout])[0].bytes == 4096


def test_max_key_count(http, runtime, group):
    runtime.control.update_group(
        InstanceGroup.model_validate(
            {**group.model_dump(), "version": 0, "cache_config": {"meta_indexer_config": {"max_key_count": 2}}}
        ),
        current_version=group.version,
    )
    http(
        "registerInstance",
        {
            "instance_group": "g1",
            "instance_id": "i1",
            "block_size": 4,
            "location_spec_infos": SPECS,
            "model_deployment": {"model_name": "m", "dtype": "f"},
        },
    )
    write(http, [1, 2])
    resp = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2, 3]})
    assert code(resp) == "REACH_MAX_ENTITY_CAPACITY" and "max_key_count" in resp["header"]["status"]["message"]
    assert _meta_statuses(http, [3]) == ["CLS_NOT_FOUND"]


def test_disabled_storage_serves_nothing_and_takes_no_writes(http, instance, runtime):
    write(http, [1])
    runtime.control.set_storage_available("nfs_01", False)
    resp = http("getCacheLocation", {"instance_id": "i1", "query_type": "QT_PREFIX_MATCH", "block_keys": [1]})
    assert code(resp) == "IO_ERROR"
    assert code(http("startWriteCache", {"instance_id": "i1", "block_keys": [2]})) == "REACH_MAX_ENTITY_CAPACITY"
    runtime.control.set_storage_available("nfs_01", True)
    resp = http("getCacheLocation", {"instance_id": "i1", "query_type": "QT_PREFIX_MATCH", "block_keys": [1]})
    assert len(resp["locations"]) == 1


def test_fault_injection(http, instance):
    assert (
        code(
            http(
                "injectFault", {"api_name": "getCacheLocation", "fault_trigger_strategy": "ONCE", "trigger_at_call": 3}
            )
        )
        == "OK"
    )
    body = {"instance_id": "i1", "query_type": "QT_BATCH_GET", "block_keys": [1]}
    assert code(http("getCacheLocation", {**body, "trace_id": "abc_2"})) == "OK"
    assert code(http("getCacheLocation", {**body, "trace_id": "abc_3"})) == "INTERNAL_ERROR"
    http("injectFault", {"api_name": "GetCacheLocation"})
    assert code(http("getCacheLocation", body)) == "INTERNAL_ERROR"
    http("removeFault", {"api_name": "getCacheLocation"})
    assert code(http("getCacheLocation", body)) == "OK"
    http("injectFault", {"api_name": "startWriteCache"})
    http("clearFaults", {})
    assert code(http("startWriteCache", {"instance_id": "i1", "block_keys": [5]})) == "OK"


def test_debug_service_off(http, instance, runtime):
    runtime.reconfigure(debug_service=False)
    assert code(http("injectFault", {"api_name": "getCacheLocation"})) == "UNSUPPORTED"


@pytest.mark.parametrize(
    "method,body,field",
    [
        ("getCacheLocation", {"trace_id": "\ud800", "query_type": "QT_PREFIX_MATCH", "block_keys": [1]}, "trace_id"),
        ("getInstanceInfo", {"instance_id": "\udfff"}, "instance_id"),
        ("finishWriteCache", {"write_session_id": "a\ud800", "success_blocks": {"offset": 0}}, "write_session_id"),
        (
            "registerInstance",
            {
                "instance_group": "g1",
                "instance_id": "i2",
                "block_size": 4,
                "location_spec_infos": SPECS,
                "model_deployment": {"model_name": "m", "dtype": "\ud800"},
            },
            "model_deployment.dtype",
        ),
    ],
)
def test_an_unpaired_surrogate_is_refused_naming_the_field(http, instance, method, body, field):
    # JSON can spell a lone UTF-16 surrogate; no UTF-8 text can hold it, so it is refused
    # before anything is stored or echoed back.
    raw = json.dumps({"instance_id": instance, **body})
    resp = http(method, raw)
    assert http.status == 200 and code(resp) == "INVALID_ARGUMENT", resp
    assert f"field '{field}': contains an unpaired UTF-16 surrogate" in resp["header"]["status"]["message"]
    assert code(http("getInstanceInfo", {"instance_id": "i2"})) == "INSTANCE_NOT_EXIST"
    # A pair is a character like any other.
    assert code(http("getInstanceInfo", {"instance_id": instance, "trace_id": "\ud83d\ude00"})) == "OK"
