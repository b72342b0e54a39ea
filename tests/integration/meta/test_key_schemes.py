"""Per-instance block-key schemes (registerInstance ``key_scheme``, issue 21.4): an instance
registered with an engine's scheme finds, from the request's ``token_ids``, the keys that
engine publishes for those tokens (golden vectors made by the engines' own code,
tests/engines/hash_vectors.json), on real Valkey and moto."""

from __future__ import annotations

import json

import pytest

from tests.engines.make_hash_vectors import VECTORS
from tests.integration.meta.harness import SPECS, code, write

CASES = json.loads(VECTORS.read_text())["cases"]


def _register(http, instance: str, block_size: int = 4, **extra) -> dict:
    return http(
        "registerInstance",
        {
            "instance_group": "g1",
            "instance_id": instance,
            "block_size": block_size,
            "location_spec_infos": SPECS,
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
            **extra,
        },
    )


def _found(http, instance: str, **keys) -> int:
    resp = http("getCacheLocation", {"instance_id": instance, "query_type": "QT_PREFIX_MATCH", **keys})
    assert code(resp) == "OK", resp
    return len(resp["locations"])


@pytest.mark.parametrize("case", CASES, ids=[f"{c['scheme']['name']}-{i}" for i, c in enumerate(CASES)])
def test_engine_published_keys_are_found_by_token_ids(http, group, case):
    assert _register(http, "i1", case["block_size"], key_scheme=case["scheme"])["header"]["status"]["code"] == "OK"
    write(http, case["keys"])  # what the engine (or a router) names
    assert _found(http, "i1", token_ids=case["tokens"]) == len(case["keys"])


def test_a_write_by_token_ids_lands_on_the_engines_keys(http, group):
    case = next(c for c in CASES if c["scheme"] == {"name": "vllm_sha256"} and c["block_size"] == 16)
    assert code(_register(http, "i1", 16, key_scheme=case["scheme"])) == "OK"
    start = http("startWriteCache", {"instance_id": "i1", "token_ids": case["tokens"]})
    assert code(start) == "OK", start
    assert len(start["locations"]) == len(case["keys"])
    finish = http(
        "finishWriteCache",
        {
            "instance_id": "i1",
            "write_session_id": start["write_session_id"],
            "success_blocks": {"offset": len(case["keys"])},
        },
    )
    assert code(finish) == "OK", finish
    assert _found(http, "i1", block_keys=case["keys"]) == len(case["keys"])


def test_the_default_stays_upstreams_rolling_hash(http, group):
    assert code(_register(http, "i1")) == "OK"
    write(http, [455111481605203084, 6902853672176602142])  # API.md's test vector
    assert _found(http, "i1", token_ids=list(range(1, 9))) == 2
    info = http("getInstanceInfo", {"instance_id": "i1"})
    assert "key_scheme" not in info["instance_info"]


def test_the_scheme_is_part_of_the_instance(http, group):
    scheme = {"name": "vllm_sha256_cbor", "seed": "0"}
    assert code(_register(http, "i1", key_scheme=scheme)) == "OK"
    shown = http("getInstanceInfo", {"instance_id": "i1"})["instance_info"]["key_scheme"]
    assert {field: value for field, value in shown.items() if value} == scheme
    assert code(_register(http, "i1", key_scheme=scheme)) == "OK"  # idempotent
    assert code(_register(http, "i1", key_scheme={"name": "vllm_sha256_cbor", "seed": "1"})) == "DUPLICATE_ENTITY"
    assert code(_register(http, "i1")) == "DUPLICATE_ENTITY"


@pytest.mark.parametrize(
    ("scheme", "field"),
    [
        ({"name": "md5"}, "key_scheme.name"),
        ({"name": "vllm_xxhash"}, "key_scheme.seed"),  # vLLM seeds it at random: not reproducible
        ({"name": "vllm_xxhash_cbor", "seed": ""}, "key_scheme.seed"),
        ({"name": "xxh64", "seed": "-1"}, "key_scheme.seed"),
        ({"name": "xxh3_64", "seed": "0x10"}, "key_scheme.seed"),
        ({"name": "xxh3_64", "seed": str(1 << 64)}, "key_scheme.seed"),
        ({"name": "vllm_sha256", "lora_name": "a"}, "key_scheme.lora_path"),
        ({"name": "vllm_sha256", "lora_path": "/a"}, "key_scheme.lora_name"),
        ({"name": "sglang", "seed": "0"}, "key_scheme.seed"),
        ({"name": "sglang", "cache_salt": "t"}, "key_scheme.cache_salt"),
        ({"name": "rolling", "lora_name": "a", "lora_path": "/a"}, "key_scheme.lora_name"),
        ({"name": "vllm_sha256", "seed": "x" * 1025}, "key_scheme.seed"),
    ],
)
def test_a_bad_scheme_is_refused_naming_the_field_and_nothing_is_registered(http, group, scheme, field):
    resp = _register(http, "i1", key_scheme=scheme)
    assert code(resp) == "INVALID_ARGUMENT", resp
    assert f"'{field}'" in resp["header"]["status"]["message"]
    assert code(http("getInstanceInfo", {"instance_id": "i1"})) == "INSTANCE_NOT_EXIST"


def test_token_ids_a_scheme_cannot_hash_are_refused_naming_the_field(http, group):
    assert code(_register(http, "i1", key_scheme={"name": "sglang"})) == "OK"
    resp = http("getCacheLocation", {"instance_id": "i1", "query_type": "QT_PREFIX_MATCH", "token_ids": [1, -2, 3, 4]})
    assert code(resp) == "INVALID_ARGUMENT", resp
    assert "'token_ids'" in resp["header"]["status"]["message"]


def test_every_call_by_token_ids_uses_the_instances_scheme(http, group):
    case = next(c for c in CASES if c["scheme"] == {"name": "sglang"} and c["block_size"] == 4)
    keys, tokens = case["keys"], case["tokens"]
    assert code(_register(http, "i1", key_scheme=case["scheme"])) == "OK"
    write(http, keys)
    length = http("getCacheLocationLen", {"instance_id": "i1", "query_type": "QT_PREFIX_MATCH", "token_ids": tokens})
    assert int(length["cache_location_len"]) == len(keys), length
    metas = http("getCacheMeta", {"instance_id": "i1", "token_ids": tokens})["metas"]
    assert [json.loads(m)["status"] for m in metas] == ["CLS_SERVING"] * len(keys)
    by_backend = http(
        "getCacheLocationsByBackend",
        {
            "instance_id": "i1",
            "query_type": "QT_BATCH_GET",
            "token_ids": tokens,
            "backend_selectors": [{"backend_type": "ST_NFS", "strategy": "LSS_WEIGHTED_RANDOM"}],
        },
    )
    assert [len(v["locations"]) for v in by_backend["key_locations"]] == [1] * len(keys), by_backend
    assert code(http("removeCache", {"instance_id": "i1", "token_ids": tokens[:4]})) == "OK"
    assert _found(http, "i1", block_keys=keys) == 0  # the first block is gone, so is the prefix
