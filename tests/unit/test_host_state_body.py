"""getHostCacheState's fast path (issue #25 item 2): a router's body decoded by msgspec, its
keys turned into integers in C, without pydantic; every other body (a key as a float, a
bool, out of int64, a string that is not decimal, null, an overlong list, other spellings)
parsed by the pydantic path, to the same request or the same error (random bodies too)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chalicelib.protocol.codes import QueryType
from chalicelib.protocol.errors import InvalidArgumentError
from chalicelib.protocol.host_state_body import decode_host_state_body
from chalicelib.protocol.models import MAX_HOST_STATE_KEYS, GetHostCacheStateRequest
from chalicelib.protocol.wire import INT64_MAX, INT64_MIN, decode_body, parse_model

BODY = {"instance_id": "e1", "query_type": "QT_PREFIX_MATCH", "block_cache_keys": ["1", "-2", str(INT64_MAX)]}


def through_pydantic(raw: bytes) -> GetHostCacheStateRequest | str:
    try:
        return parse_model(GetHostCacheStateRequest, decode_body(raw))
    except InvalidArgumentError as err:
        return str(err)


def through_from_body(raw: bytes) -> GetHostCacheStateRequest | str:
    try:
        return GetHostCacheStateRequest.from_body(raw)  # type: ignore[return-value]
    except InvalidArgumentError as err:
        return str(err)


@pytest.mark.parametrize(
    "body",
    [
        BODY,
        {**BODY, "block_cache_keys": [1, -2, INT64_MIN, INT64_MAX]},
        {**BODY, "block_cache_keys": [1, "2", -3]},  # numbers and strings mixed
        {
            "instance_id": "e1",
            "query_type": "QT_PREFIX_MATCH_WITH_MAMBA",
            "block_cache_keys": [7],
            "medium": ["gpu", "mem"],
            "p2p_host_count": 2,
            "trace_id": "t",
            "header": {"trace_id": "h"},
        },
        {"instance_id": "e1", "block_cache_keys": []},
        {**BODY, "block_cache_keys": list(range(MAX_HOST_STATE_KEYS))},  # the bound itself
    ],
)
def test_a_routers_body_is_decoded_without_pydantic(monkeypatch, body):
    raw = json.dumps(body).encode()
    expected = through_pydantic(raw)

    def refuse(*_args, **_kwargs):
        raise AssertionError("pydantic validated a router's body")

    monkeypatch.setattr(GetHostCacheStateRequest, "model_validate", refuse)
    assert decode_host_state_body(raw, MAX_HOST_STATE_KEYS) is not None
    request = GetHostCacheStateRequest.from_body(raw)
    assert request == expected
    assert type(request.block_cache_keys) is list and all(type(k) is int for k in request.block_cache_keys)


def test_the_query_type_and_header_are_members_and_models():
    raw = json.dumps({**BODY, "query_type": "QT_PREFIX_MATCH_WITH_MAMBA", "header": {"trace_id": "h"}})
    request = GetHostCacheStateRequest.from_body(raw)
    assert isinstance(request, GetHostCacheStateRequest)
    assert request.query_type is QueryType.QT_PREFIX_MATCH_WITH_MAMBA and request.effective_trace_id == "h"


#: Bodies the fast path must leave to pydantic: (body, what the error names, None if valid).
OTHERS = [
    ({**BODY, "block_cache_keys": [1, 2.5]}, "block_cache_keys[1]"),
    ({**BODY, "block_cache_keys": [1.0, 2]}, None),  # an integral float is the integer
    ({**BODY, "block_cache_keys": [1, True]}, "block_cache_keys[1]"),
    ({**BODY, "block_cache_keys": [INT64_MAX + 1]}, "block_cache_keys[0]"),
    ({**BODY, "block_cache_keys": [INT64_MIN - 1]}, "block_cache_keys[0]"),
    ({**BODY, "block_cache_keys": [str(INT64_MAX + 1)]}, "block_cache_keys[0]"),
    ({**BODY, "block_cache_keys": ["1", "1.0"]}, "block_cache_keys[1]"),  # msgspec's lax mode reads 1
    ({**BODY, "block_cache_keys": ["1e3"]}, "block_cache_keys[0]"),  # and this 1000
    ({**BODY, "block_cache_keys": [" 1"]}, "block_cache_keys[0]"),
    ({**BODY, "block_cache_keys": ["1,2"]}, "block_cache_keys[0]"),
    ({**BODY, "block_cache_keys": ["0x10"]}, "block_cache_keys[0]"),
    ({**BODY, "block_cache_keys": [""]}, "block_cache_keys[0]"),
    ({**BODY, "block_cache_keys": ["007"]}, None),  # a decimal string, leading zeros and all
    ({**BODY, "block_cache_keys": [1, None]}, "block_cache_keys[1]"),
    ({**BODY, "block_cache_keys": [[1]]}, "block_cache_keys[0]"),
    ({**BODY, "block_cache_keys": "1"}, "block_cache_keys"),
    ({**BODY, "block_cache_keys": None}, None),  # null: the default (empty)
    ({**BODY, "block_cache_keys": list(range(MAX_HOST_STATE_KEYS + 1))}, f"{MAX_HOST_STATE_KEYS:,}"),
    ({**BODY, "instance_id": None}, None),
    ({**BODY, "instance_id": 5}, "instance_id"),
    ({**BODY, "instance_id": "\ud800"}, "instance_id"),  # an unpaired surrogate, which json.loads takes
    ({**BODY, "query_type": 1}, None),  # by number
    ({**BODY, "query_type": "QT_NOPE"}, "query_type"),
    ({**BODY, "medium": "gpu"}, "medium"),
    ({**BODY, "p2p_host_count": INT64_MAX + 1}, "p2p_host_count"),
    ({**BODY, "p2p_host_count": "3"}, None),
    ({"instanceId": "e1", "blockCacheKeys": ["1"]}, None),  # camelCase
    ({**BODY, "future_field": 1}, None),  # unknown fields are ignored
]


@pytest.mark.parametrize(("body", "named"), OTHERS)
def test_other_bodies_take_the_pydantic_path_with_its_result(body, named):
    raw = json.dumps(body).encode()
    assert decode_host_state_body(raw, MAX_HOST_STATE_KEYS) is None
    expected = through_pydantic(raw)
    assert through_from_body(raw) == expected
    if named is None:
        assert isinstance(expected, GetHostCacheStateRequest), expected
    else:
        assert isinstance(expected, str) and named in expected, expected


KEY_ITEMS = st.one_of(
    st.integers(min_value=INT64_MIN - 2, max_value=INT64_MAX + 2),
    st.integers(min_value=INT64_MIN - 2, max_value=INT64_MAX + 2).map(str),
    st.text(alphabet="0123456789-+., e\"'", max_size=6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(KEY_ITEMS, max_size=6), spacing=st.sampled_from([(",", ":"), (", ", ": ")]))
def test_random_key_lists_parse_as_pydantic_parses_them(keys, spacing):
    raw = json.dumps({**BODY, "block_cache_keys": keys}, separators=spacing).encode()
    assert through_from_body(raw) == through_pydantic(raw)


def test_a_repeated_field_counts_its_last_value_on_both_paths():
    raw = b'{"instance_id":"a","instance_id":"e1","block_cache_keys":[1],"block_cache_keys":["2",3]}'
    assert decode_host_state_body(raw, MAX_HOST_STATE_KEYS) is not None
    request = through_from_body(raw)
    assert request == through_pydantic(raw)
    assert isinstance(request, GetHostCacheStateRequest)
    assert (request.instance_id, request.block_cache_keys) == ("e1", [2, 3])
