"""proto3-JSON parsing (nulls, integer and enum strings) and rendering, including responses
whose locations were rendered to JSON by the code that built them."""

import json
import re

import pytest
from pydantic import ValidationError

from chalicelib.protocol.errors import InvalidArgumentError
from chalicelib.protocol.models import (
    CacheLocations,
    FinishWriteCacheResponse,
    GetCacheLocationLenResponse,
    GetCacheLocationRequest,
    GetCacheLocationResponse,
    GetCacheLocationsByBackendResponse,
    GetCacheMetaDetailResponse,
    GetCacheMetaResponse,
    GetClusterInfoResponse,
    GetHostCacheStateResponse,
    GetInstanceInfoResponse,
    RegisterInstanceRequest,
    RegisterInstanceResponse,
    ReportEventResponse,
    Response,
    ResponseHeader,
    StartWriteCacheRequest,
    StartWriteCacheResponse,
    TrimCacheRequest,
)
from chalicelib.protocol.wire import ParseLimits, parse_model, render
from chalicelib.routes import admin, debug, meta

LOCATIONS = [
    {"type": "ST_NFS", "spec_size": 1, "location_specs": [{"name": 'a"%s', "uri": "file://x/1?blkid=0"}]},
    {"type": "ST_UNSPECIFIED", "spec_size": 1, "location_specs": [{"name": "é\\", "uri": ""}]},
]


def test_spliced_locations_render_like_pydantic_would():
    spliced = GetCacheMetaResponse(locations=CacheLocations.of(LOCATIONS), metas=["m1", "m2"])
    assert json.loads(render(spliced)) == json.loads(spliced.model_dump_json(exclude_none=True))
    assert json.loads(render(spliced)) == {
        "header": {"request_id": "", "status": {"code": "OK", "message": ""}},
        "locations": LOCATIONS,
        "metas": ["m1", "m2"],
        "replica_locations": [],
    }


def test_texts_are_spliced_verbatim():
    texts = ['{"type":"ST_NFS","spec_size":0,"location_specs":[]}'] * 2
    text = render(GetCacheLocationResponse.model_construct(header=ResponseHeader(), locations=CacheLocations(texts)))
    assert text.endswith(',"locations":[' + ",".join(texts) + "]}")
    assert json.loads(text)["locations"][1]["spec_size"] == 0


def test_empty_locations_render_as_an_empty_array():
    assert json.loads(render(GetCacheLocationResponse()))["locations"] == []


def test_a_json_array_reads_like_a_list():
    locations = CacheLocations.of(LOCATIONS)
    assert len(locations) == 2 and locations[1] == LOCATIONS[1] and locations[:1] == LOCATIONS[:1]
    assert locations == LOCATIONS and locations == CacheLocations.of(LOCATIONS) and locations != LOCATIONS[:1]
    assert list(locations) == LOCATIONS


def test_validation_from_a_list_checks_the_items():
    assert GetCacheLocationResponse(locations=LOCATIONS).locations == LOCATIONS
    with pytest.raises(ValidationError, match="spec_size"):
        GetCacheLocationResponse(locations=[{"type": "ST_NFS", "spec_size": "two", "location_specs": []}])


GET = {"instance_id": "i1", "query_type": "QT_PREFIX_MATCH", "block_keys": [1]}


@pytest.mark.parametrize(
    "name",
    [
        "location_spec_names",
        "locationSpecNames",
        "token_ids",
        "tokenIds",
        "trace_id",
        "traceId",
        "sw_size",
        "swSize",
        "header",
        "block_mask",
        "blockMask",
    ],
)
def test_null_field_is_its_default(name):
    assert parse_model(GetCacheLocationRequest, {**GET, name: None}) == parse_model(GetCacheLocationRequest, GET)


def test_null_fields_of_sub_messages_are_their_defaults():
    req = parse_model(GetCacheLocationRequest, {**GET, "block_mask": {"offset": None, "boolMasks": {"values": None}}})
    assert req.block_mask.offset is None and req.block_mask.bool_masks.values == []
    req = parse_model(
        RegisterInstanceRequest,
        {
            "location_spec_infos": [{"name": "a", "size": None}],
            "model_deployment": {"model_name": "m", "tp_size": None},
        },
    )
    assert req.location_spec_infos[0].size == 0 and req.model_deployment.tp_size == 0


@pytest.mark.parametrize(
    "model,body,field",
    [
        (GetCacheLocationRequest, {**GET, "block_keys": [1, None]}, "block_keys[1]"),
        (GetCacheLocationRequest, {**GET, "token_ids": [None]}, "token_ids[0]"),
        (GetCacheLocationRequest, {**GET, "location_spec_names": ["tp0", None]}, "location_spec_names[1]"),
        (
            GetCacheLocationRequest,
            {**GET, "block_mask": {"bool_masks": {"values": [True, None]}}},
            "block_mask.bool_masks.values[1]",
        ),
        (RegisterInstanceRequest, {"location_spec_infos": [{"name": "a"}, None]}, "location_spec_infos[1]"),
    ],
)
def test_a_null_item_of_a_list_is_refused_at_its_index(model, body, field):
    with pytest.raises(InvalidArgumentError, match=re.escape(f"field '{field}'")):
        parse_model(model, body)


@pytest.mark.parametrize("text", [" 1 ", "1 ", "+3", "1_0", "1\n", "\u0661", "", "-", "--1", "1.0", "0x10"])
@pytest.mark.parametrize(
    "field,body",
    [
        ("block_keys[0]", lambda text: {**GET, "block_keys": [text]}),
        ("sw_size", lambda text: {**GET, "sw_size": text}),
    ],
    ids=["int64", "int32"],
)
def test_an_integer_string_is_only_an_optional_minus_and_digits(text, field, body):
    with pytest.raises(InvalidArgumentError, match=re.escape(f"field '{field}'")):
        parse_model(GetCacheLocationRequest, body(text))


@pytest.mark.parametrize("bad", [" 1", "1,2", "1_0", "", str(2**63), "\u0661", 7.5])
def test_a_long_list_of_decimal_strings_names_its_bad_item(bad):
    """Keys arrive as strings (proto3 JSON prints int64 so) and are checked in bulk: an
    item that is not an optional minus and digits, or out of range, is named at its index."""
    keys = [str(k) for k in range(-10, 20_000)]
    assert parse_model(GetCacheLocationRequest, {**GET, "block_keys": keys}).block_keys == list(range(-10, 20_000))
    keys[12_345] = bad
    with pytest.raises(InvalidArgumentError, match=re.escape("field 'block_keys[12345]'")):
        parse_model(GetCacheLocationRequest, {**GET, "block_keys": keys})


def test_decimal_integer_strings_are_accepted():
    req = parse_model(GetCacheLocationRequest, {**GET, "block_keys": ["-5", "007", str(2**63 - 1)], "sw_size": "-0"})
    assert req.block_keys == [-5, 7, 2**63 - 1] and req.sw_size == 0
    req = parse_model(TrimCacheRequest, {"begin_timestamp": "-12", "end_timestamp": "34"})
    assert (req.begin_timestamp, req.end_timestamp) == (-12, 34)


@pytest.mark.parametrize(
    "value,name",
    [
        ("2", "QT_PREFIX_MATCH"),
        ("0", "QT_UNSPECIFIED"),
        (3, "QT_REVERSE_ROLL_SW_MATCH"),
        ("QT_BATCH_GET", "QT_BATCH_GET"),
    ],
)
def test_an_enum_is_a_name_a_number_or_a_number_as_a_string(value, name):
    assert parse_model(GetCacheLocationRequest, {**GET, "query_type": value}).query_type.name == name


@pytest.mark.parametrize("value", ["77", "-1", " 2", "+2", "2.0", "QT_NOPE", 77, True])
def test_an_unknown_enum_is_refused_naming_the_field(value):
    with pytest.raises(InvalidArgumentError, match="field 'query_type': unknown QueryType"):
        parse_model(GetCacheLocationRequest, {**GET, "query_type": value})


@pytest.mark.parametrize("op", meta.OPERATIONS, ids=lambda op: op.api_name)
def test_each_meta_operation_knows_its_response_model(op):
    # Errors render op.response_model (read from the handler's return annotation).
    expected = {
        "registerInstance": RegisterInstanceResponse,
        "getInstanceInfo": GetInstanceInfoResponse,
        "getCacheLocation": GetCacheLocationResponse,
        "getCacheMeta": GetCacheMetaResponse,
        "getCacheMetaDetail": GetCacheMetaDetailResponse,
        "startWriteCache": StartWriteCacheResponse,
        "finishWriteCache": FinishWriteCacheResponse,
        "getCacheLocationLen": GetCacheLocationLenResponse,
        "getClusterInfo": GetClusterInfoResponse,
        "reportEvent": ReportEventResponse,
        "getHostCacheState": GetHostCacheStateResponse,
        "getCacheLocationsByBackend": GetCacheLocationsByBackendResponse,
    }
    assert op.response_model is expected.get(op.api_name, Response)


@pytest.mark.parametrize("op", admin.OPERATIONS + debug.OPERATIONS, ids=lambda op: op.api_name)
def test_every_admin_and_debug_operation_has_a_response_model(op):
    assert issubclass(op.response_model, Response)


LIMITS = ParseLimits(max_keys=16)


@pytest.mark.parametrize("field", ["block_keys", "blockKeys"])
def test_a_key_list_over_the_limit_is_refused_by_its_length(field):
    """Issue 28.4: the length is checked before any item, whatever the items are."""
    for items in (["x"] * 500_000, list(range(17))):
        with pytest.raises(InvalidArgumentError, match=r"^field 'block_keys': \d+ keys exceed the limit of 16$"):
            parse_model(GetCacheLocationRequest, {**GET, field: items}, LIMITS)
    assert parse_model(GetCacheLocationRequest, {**GET, field: list(range(16))}, LIMITS).block_keys == list(range(16))


@pytest.mark.parametrize(
    "model, body, first",
    [
        (GetCacheLocationRequest, {"token_ids": ["x"] * 100_000}, "token_ids[0]"),
        (GetCacheLocationRequest, {"block_keys": [1, "x", "y", "z"]}, "block_keys[1]"),
        (StartWriteCacheRequest, {"location_spec_group_names": [1] * 100_000}, "location_spec_group_names[0]"),
        (RegisterInstanceRequest, {"location_spec_infos": [{"size": "x"}] * 9}, "location_spec_infos[0].size"),
    ],
)
def test_a_list_stops_at_its_first_bad_item(model, body, first):
    """Issue 28.4: one error per list, not one per item (500,000 took seconds of CPU)."""
    with pytest.raises(InvalidArgumentError) as refused:
        parse_model(model, body, LIMITS)
    assert str(refused.value).startswith(f"field '{first}': ") and "invalid fields" not in str(refused.value)


def test_each_bad_field_counts_once_and_the_first_five_are_named():
    body = {
        "instance_id": 1,
        "block_keys": ["x"] * 9,
        "token_ids": ["y"] * 9,
        "location_spec_names": [1, 2],
        "sw_size": "z",
        "query_type": "QT_NONE",
    }
    with pytest.raises(InvalidArgumentError) as refused:
        parse_model(GetCacheLocationRequest, body, LIMITS)
    text = str(refused.value)
    assert text.count("field '") == 5 and text.endswith(" (6 invalid fields found)"), text
    assert all(f"field '{name}'" in text for name in ("instance_id", "block_keys[0]", "token_ids[0]"))
