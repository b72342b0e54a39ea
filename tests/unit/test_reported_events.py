"""reportEvent's fast path (issue #25 item 1): an engine's body decoded into msgspec structs in
one pass, every other body through the pydantic models with the same result or the same
error (random bodies too); the bulk URI check agreeing with the per-URI one; a location
packed by msgspec as cmsgpack packs it."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chalicelib.cache.event_reports import _check_uris, _uris_valid, encode_events
from chalicelib.protocol.errors import InvalidArgumentError, MalformedBodyError
from chalicelib.protocol.models import EventItem, ReportEventRequest
from chalicelib.protocol.reported_events import BlockAdd, Event, Spec, decode_report_body
from chalicelib.protocol.wire import decode_body, parse_model
from chalicelib.stores.reporters import _location, add_event, add_event_of, pack_strings

ADD = {
    "event_type": "EVENT_BLOCK_ADD",
    "block_add": {
        "block_key": "42",
        "medium": "gpu",
        "specs": [{"name": "full_0", "uri": "event_report://10.0.0.1:9600/gpu/42?size=4096"}],
    },
}
BODY = {"instance_id": "i", "host_ip_port": "10.0.0.1:8080", "storage_type": "ST_EVENT_REPORT_L1P5", "events": [ADD]}


def through_pydantic(body: object) -> ReportEventRequest:
    return parse_model(ReportEventRequest, decode_body(json.dumps(body)))


def test_an_engine_body_builds_no_pydantic_model_per_event(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("EventItem built on the fast path")

    monkeypatch.setattr(EventItem, "model_validate", refuse)
    monkeypatch.setattr(EventItem, "__init__", refuse)
    body = {**BODY, "events": [ADD] * 3 + [{"event_type": "EVENT_HEARTBEAT", "heartbeat": {}}], "trace_id": "t"}
    request = ReportEventRequest.from_body(json.dumps(body).encode())
    assert all(type(event) is Event for event in request.events)
    assert decode_report_body(json.dumps(body)) is not None
    assert request.events[0].block_add == BlockAdd(
        block_key="42", medium="gpu", specs=[Spec(name="full_0", uri="event_report://10.0.0.1:9600/gpu/42?size=4096")]
    )
    assert (request.instance_id, request.trace_id, request.storage_type.name) == ("i", "t", "ST_EVENT_REPORT_L1P5")


OTHER_SPELLINGS = [
    # camelCase names, enums by number, nulls as defaults, unknown fields ignored
    {
        "instanceId": "i",
        "hostIpPort": "h",
        "storageType": 4,
        "events": [{"eventType": 2, "blockAdd": {"blockKey": "7"}}],
    },
    {**BODY, "events": [{**ADD, "block_delete": None}], "header": {"trace_id": "t"}},
    {**BODY, "events": [{**ADD, "extra": 1}], "storage_type": "1"},
    {**BODY, "events": [{"event_type": "EVENT_BLOCK_ADD", "block_delete": {"block_key": "1"}}]},
    {**BODY, "events": [{"event_type": "EVENT_HOST_DOWN", "host_down": {}}], "trace_id": None},
]


@pytest.mark.parametrize("body", OTHER_SPELLINGS)
def test_other_spellings_parse_as_pydantic_parses_them(body):
    fast, slow = ReportEventRequest.from_body(json.dumps(body).encode()), through_pydantic(body)
    assert fast == slow
    assert all(type(event) is Event for event in fast.events)


INVALID = [
    {**BODY, "events": [{**ADD, "block_delete": {"block_key": "1"}}]},  # two payloads
    {**BODY, "events": [{"event_type": "EVENT_NOPE", "block_add": {}}]},
    {**BODY, "events": [ADD, {"event_type": "EVENT_BLOCK_ADD", "block_add": {"specs": [{"name": 5}]}}]},
    {**BODY, "instance_id": "\ud800"},  # an unpaired surrogate, which json.loads takes
    {**BODY, "storage_type": "ST_NOPE"},
    {**BODY, "events": {"not": "a list"}},
]


@pytest.mark.parametrize("body", INVALID)
def test_invalid_bodies_get_the_pydantic_error(body):
    raw = json.dumps(body).encode()
    with pytest.raises(InvalidArgumentError) as fast:
        ReportEventRequest.from_body(raw)
    with pytest.raises(InvalidArgumentError) as slow:
        through_pydantic(body)
    assert str(fast.value) == str(slow.value)
    assert (
        "field 'events" in str(fast.value)
        or "field 'instance_id'" in str(fast.value)
        or "storage_type" in str(fast.value)
    )


@pytest.mark.parametrize("raw", [b"{", b"[1]", b"\xff", b'{"events": NaN}'])
def test_bodies_that_are_no_json_object_stay_malformed(raw):
    if raw == b'{"events": NaN}':  # json.loads takes NaN: pydantic then names the field
        with pytest.raises(InvalidArgumentError, match="events"):
            ReportEventRequest.from_body(raw)
        return
    with pytest.raises(MalformedBodyError):
        ReportEventRequest.from_body(raw)


def test_both_paths_give_the_same_item_codes():
    events = [
        ADD,
        {**ADD, "block_add": {**ADD["block_add"], "block_key": "x"}},
        {**ADD, "block_add": {**ADD["block_add"], "specs": []}},
        {"event_type": "EVENT_BLOCK_DELETE", "block_delete": {"block_key": "42", "medium": "gpu"}},
        {"event_type": "EVENT_BLOCK_ADD"},
    ]
    body = {**BODY, "events": events}
    fast = encode_events(ReportEventRequest.from_body(json.dumps(body).encode()).events)
    camel = {**body, "instanceId": body.pop("instance_id")}
    slow = encode_events(through_pydantic(camel).events)
    assert fast == slow
    assert [code is None for code in fast[0]] == [True, False, False, False, False]


URIS = [
    "event_report://10.0.0.1:9600/gpu/1?size=4096",
    "s3://bucket/key",
    "a+b.c-d_e://host",
    "x://h/p?q=1&r=2?s",
    "x://h?s_version=1",
    "x://h?a=1&s_version=2",
    "x://h/s_version=1",
    "x://h#frag",
    "x:///path",
    "x://?q",
    "x://h/a b",
    "x://h/a\tb",
    "x://h/a\x1cb",
    "x://h\ny://g",
    "x://h/é",
    "x://h/a\u00a0b",
    "",
    "1x://h",
    "x:/h",
    "://h",
]


def per_uri_valid(uri: str) -> bool:
    try:
        _check_uris([uri])
    except Exception:  # noqa: BLE001 - ItemError
        return False
    return True


def events_of(uris: list[str]) -> list[Event]:
    return [Event(event_type="EVENT_BLOCK_ADD", block_add=BlockAdd(specs=[Spec(name="n", uri=u)])) for u in uris]


@pytest.mark.parametrize("uri", URIS)
def test_the_bulk_uri_check_passes_only_what_the_per_uri_check_passes(uri):
    # A URI naming s_version anywhere sends the request to the per-URI check (a path may).
    expected = per_uri_valid(uri) and "s_version" not in uri
    assert _uris_valid(events_of([URIS[0], uri, URIS[1]])) is expected
    assert _uris_valid(events_of([uri])) is expected


def test_the_bulk_uri_check_passes_a_batch_of_valid_uris():
    good = [u for u in URIS if per_uri_valid(u) and "s_version" not in u]
    assert len(good) >= 5 and _uris_valid(events_of(good * 50))
    assert _uris_valid([])


@pytest.mark.parametrize("size", [0, 31, 32, 255, 256, 65535, 65536])
def test_a_location_packs_as_pack_strings_does(size):
    names, uris = ("full_0", "é" * 3), ["x://" + "u" * size, "y://é"]
    flat = ["gpu", names[0], uris[0], names[1], uris[1]]
    assert _location("gpu", names, uris) == pack_strings(flat)
    event = add_event_of(-5, "gpu", names, uris)
    assert event == add_event(-5, "gpu", list(zip(names, uris, strict=True)))
    # the run's two strings: the 8-byte key, then the location
    assert event[3] == pack_strings([(-5).to_bytes(8, "big", signed=True), pack_strings(flat)])[1:]


def _outcome(parse, raw: bytes) -> object:
    try:
        return parse(raw)
    except (InvalidArgumentError, MalformedBodyError) as err:
        return (type(err).__name__, str(err))


_TEXT = st.sampled_from(["", "42", "-1", "1_0", " 7", "gpu", "a#b", "x://h/1", "x://h?s_version=1", "\u00e9"])
_VALUE = st.one_of(_TEXT, st.none(), st.integers(-3, 3), st.booleans())
_SPEC = st.dictionaries(st.sampled_from(["name", "uri", "size"]), _VALUE, max_size=3)
_PAYLOAD = st.fixed_dictionaries(
    {},
    optional={
        "block_key": _VALUE,
        "blockKey": _VALUE,
        "medium": _VALUE,
        "uri": _VALUE,
        "specs": st.one_of(st.lists(_SPEC, max_size=3), st.none(), _TEXT),
        "spec_names": st.lists(_VALUE, max_size=2),
        "mediums": st.lists(_VALUE, max_size=2),
        "blocks": st.lists(st.fixed_dictionaries({}, optional={"block_key": _VALUE, "specs": st.lists(_SPEC)})),
    },
)
_EVENT = st.dictionaries(
    st.sampled_from(
        [
            "event_type",
            "eventType",
            "block_add",
            "blockAdd",
            "block_delete",
            "node_register",
            "heartbeat",
            "host_down",
            "block_snapshot",
            "other",
        ]
    ),
    st.one_of(
        st.sampled_from(["EVENT_BLOCK_ADD", "EVENT_BLOCK_DELETE", "EVENT_HEARTBEAT", "EVENT_NOPE", 2, "3"]),
        st.just({}),  # every payload's empty form: two of them make a body the fast path must refuse
        _PAYLOAD,
        st.none(),
    ),
    max_size=4,
)
_BODY = st.fixed_dictionaries(
    {},
    optional={
        "instance_id": _VALUE,
        "host_ip_port": _VALUE,
        "storage_type": st.sampled_from(["ST_EVENT_REPORT_L1P5", "ST_EVENT_REPORT_L2", 4, "ST_NOPE", None]),
        "events": st.one_of(st.lists(_EVENT, max_size=4), st.none(), _TEXT),
        "trace_id": _VALUE,
        "header": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"trace_id": _VALUE, "x": _VALUE})),
    },
)


@settings(max_examples=600, deadline=None, derandomize=True)
@given(_BODY)
def test_any_body_parses_as_the_pydantic_path_parses_it(body):
    raw = json.dumps(body).encode()
    fast = _outcome(ReportEventRequest.from_body, raw)
    slow = _outcome(lambda data: parse_model(ReportEventRequest, decode_body(data)), raw)
    assert fast == slow
    if isinstance(fast, ReportEventRequest) and isinstance(slow, ReportEventRequest):
        assert encode_events(fast.events)[0] == encode_events(slow.events)[0]
