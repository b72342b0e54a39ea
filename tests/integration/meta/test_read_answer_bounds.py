"""Read answers are bounded like startWriteCache's (issue 28.5): a read whose locations could
pass the 6 MB an API response may carry is refused before Valkey is read, naming the key
field and the largest key count that fits; one key fewer than that is answered."""

from __future__ import annotations

import json
import re

import pytest

from .harness import code, write

#: 64 specs with 200-character names: one location is about 17 KB, so a few hundred keys
#: reach the bound (16,384 keys, the request limit, would answer about 280 MB).
WIDE_SPECS = [{"name": f"spec{i:02d}_" + "n" * 193, "size": 64} for i in range(64)]
LIMIT = 6_000_000


@pytest.fixture
def wide(http, group):
    resp = http(
        "registerInstance",
        {
            "instance_group": "g1",
            "instance_id": "wide",
            "block_size": 4,
            "location_spec_infos": WIDE_SPECS,
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )
    assert code(resp) == "OK", resp
    start = write(http, [7], instance="wide")
    return len(json.dumps(start["locations"][0], separators=(",", ":"))) + 1


def _fit(resp: dict, field: str, unit: str) -> int:
    """The largest count a refusal says fits, after checking it names ``field``."""
    assert code(resp) == "INVALID_ARGUMENT", resp
    message = resp["header"]["status"]["message"]
    assert f"field '{field}'" in message and "6 MB" in message, message
    found = re.search(rf"send at most (\d+) {unit}", message)
    assert found, message
    return int(found.group(1))


def _location(http, keys, **extra):
    return http("getCacheLocation", {"instance_id": "wide", "query_type": "QT_BATCH_GET", "block_keys": keys, **extra})


def test_get_cache_location_over_the_bound_is_refused_with_the_count_that_fits(http, wide):
    resp = _location(http, list(range(1, 2001)))
    fit = _fit(resp, "block_keys", "keys")
    # the estimate is the widest location the layout makes: the written one's width plus
    # at most the widest ids' extra digits in each of its 64 URIs, never below it
    assert LIMIT // (wide + 64 * 32) <= fit <= LIMIT // wide
    assert code(_location(http, list(range(1, fit + 2)))) == "INVALID_ARGUMENT"
    answered = _location(http, list(range(1, fit + 1)))
    assert code(answered) == "OK", answered["header"]
    assert len(answered["locations"]) == fit
    hit = answered["locations"][6]
    assert hit["spec_size"] == 64 and all(s["uri"] for s in hit["location_specs"])
    assert not any(s["uri"] for s in answered["locations"][0]["location_specs"])


def test_prefix_match_counts_the_unmasked_keys_and_a_spec_filter_narrows_the_bound(http, wide):
    keys = list(range(1, 2001))
    fit = _fit(_location(http, keys), "block_keys", "keys")
    # a prefix match answers the unmasked keys only: masking all but `fit` fits
    masked = _location(http, keys, query_type="QT_PREFIX_MATCH", block_mask={"offset": len(keys) - fit})
    assert code(masked) == "OK", masked["header"]
    # one spec of 64 per location: 2,000 keys fit easily
    one_spec = _location(http, keys, location_spec_names=[WIDE_SPECS[0]["name"]])
    assert code(one_spec) == "OK", one_spec["header"]
    assert len(one_spec["locations"]) == len(keys)


def test_token_ids_are_refused_in_tokens(http, wide):
    resp = http(
        "getCacheLocation",
        {"instance_id": "wide", "query_type": "QT_BATCH_GET", "token_ids": list(range(4 * 2000))},
    )
    tokens = _fit(resp, "token_ids", "tokens")
    assert tokens % 4 == 0
    answered = http(
        "getCacheLocation",
        {"instance_id": "wide", "query_type": "QT_BATCH_GET", "token_ids": list(range(tokens))},
    )
    assert code(answered) == "OK", answered["header"]
    assert len(answered["locations"]) == tokens // 4


def test_get_cache_meta_is_bounded_with_its_metas(http, wide):
    location_fit = _fit(_location(http, list(range(1, 2001))), "block_keys", "keys")
    resp = http("getCacheMeta", {"instance_id": "wide", "block_keys": list(range(1, 2001))})
    fit = _fit(resp, "block_keys", "keys")
    assert fit <= location_fit  # each key's meta counts too
    assert code(http("getCacheMeta", {"instance_id": "wide", "block_keys": list(range(1, fit + 2))})) != "OK"
    answered = http("getCacheMeta", {"instance_id": "wide", "block_keys": list(range(1, fit + 1))})
    assert code(answered) == "OK", answered["header"]
    assert len(answered["metas"]) == fit
    assert json.loads(answered["metas"][6])["status"] == "CLS_SERVING"


def test_get_cache_locations_by_backend_is_bounded(http, wide):
    def by_backend(keys):
        return http(
            "getCacheLocationsByBackend",
            {
                "instance_id": "wide",
                "query_type": "QT_BATCH_GET",
                "block_keys": keys,
                "backend_selectors": [{"backend_type": "ST_NFS", "strategy": "LSS_WEIGHTED_RANDOM"}],
            },
        )

    fit = _fit(by_backend(list(range(1, 2001))), "block_keys", "keys")
    assert code(by_backend(list(range(1, fit + 2)))) == "INVALID_ARGUMENT"
    answered = by_backend(list(range(1, fit + 1)))
    assert code(answered) == "OK", answered["header"]
    assert len(answered["key_locations"]) == fit
    assert len(answered["key_locations"][6]["locations"]) == 1


def test_get_cache_location_len_answers_a_count_whatever_the_locations_size(http, wide):
    resp = http(
        "getCacheLocationLen", {"instance_id": "wide", "query_type": "QT_BATCH_GET", "block_keys": list(range(1, 2001))}
    )
    assert code(resp) == "OK", resp["header"]
    assert int(resp["cache_location_len"]) == 1


def test_start_write_cache_refusal_names_the_count_that_fits(http, wide):
    resp = http("startWriteCache", {"instance_id": "wide", "block_keys": list(range(100, 2100))})
    fit = _fit(resp, "block_keys", "keys")
    assert fit == _fit(_location(http, list(range(1, 2001))), "block_keys", "keys")
