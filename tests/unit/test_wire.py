"""Rendering responses whose locations were rendered to JSON by the code that built them."""
import json

import pytest
from pydantic import ValidationError

from chalicelib.protocol.models import CacheLocations, GetCacheLocationResponse, GetCacheMetaResponse, ResponseHeader
from chalicelib.protocol.wire import render

LOCATIONS = [
    {"type": "ST_NFS", "spec_size": 1, "location_specs": [{"name": 'a"%s', "uri": "file://x/1?blkid=0"}]},
    {"type": "ST_UNSPECIFIED", "spec_size": 1, "location_specs": [{"name": "é\\", "uri": ""}]},
]


def test_spliced_locations_render_like_pydantic_would():
    spliced = GetCacheMetaResponse(locations=CacheLocations.of(LOCATIONS), metas=["m1", "m2"])
    assert json.loads(render(spliced)) == json.loads(spliced.model_dump_json(exclude_none=True))
    assert json.loads(render(spliced)) == {"header": {"request_id": "", "status": {"code": "OK", "message": ""}},
                                           "locations": LOCATIONS, "metas": ["m1", "m2"]}


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
