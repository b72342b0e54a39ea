"""KVCM's block-key schemes against golden vectors made by the engines' own hashing code
(tests/engines/hash_vectors.json; tests/engines/make_hash_vectors.py made it, and
tests/integration/engines/test_hash_vectors.py checks it against the wheels)."""

from __future__ import annotations

import json
import random

import pytest

from chalicelib.protocol.block_keys import (
    ROLLING,
    _cbor,
    keys_from_tokens,
    request_keys,
    scheme_from_config,
    scheme_from_text,
)
from chalicelib.protocol.errors import InvalidArgumentError
from chalicelib.protocol.models import KeySchemeConfig
from connectors.kv_events import BlockRemoved, BlockStored
from connectors.relay import RelayConfig, RelayStats, Translator
from tests.engines.make_hash_vectors import VECTORS

CASES = json.loads(VECTORS.read_text())["cases"]
IDS = [f"{c['scheme']['name']}-{i}" for i, c in enumerate(CASES)]


def _scheme(case):
    return scheme_from_config(KeySchemeConfig.model_validate(case["scheme"]))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_keys_are_the_engines(case):
    assert _scheme(case).keys(case["tokens"], case["block_size"]) == case["keys"]


@pytest.mark.parametrize(
    "case", [c for c in CASES if c["hashes"]], ids=[i for i, c in zip(IDS, CASES, strict=True) if c["hashes"]]
)
def test_block_hashes_are_the_engines(case):
    hashes = _scheme(case).chain(case["tokens"], case["block_size"])
    assert [h.hex() for h in hashes] == case["hashes"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_chain_resumes_from_its_parents_hash(case):
    scheme, size, tokens = _scheme(case), case["block_size"], case["tokens"]
    first = scheme.chain(tokens[:size], size)
    assert [scheme.key(h) for h in scheme.chain(tokens[size:], size, first[-1])] == case["keys"][1:]


def test_the_default_is_upstreams_rolling_hash():
    assert scheme_from_config(None) is ROLLING
    assert scheme_from_config(KeySchemeConfig(name="rolling")) is ROLLING
    assert ROLLING.keys(list(range(1, 9)), 4) == [455111481605203084, 6902853672176602142]  # API.md
    assert ROLLING.chain(list(range(5, 9)), 4, 455111481605203084) == [6902853672176602142]
    assert keys_from_tokens(list(range(1, 8)), 4) == [455111481605203084]  # partial block dropped


def test_schemes_of_the_same_configuration_are_shared():
    config = {"name": "vllm_sha256", "seed": "0"}
    assert scheme_from_config(KeySchemeConfig(**config)) is scheme_from_config(KeySchemeConfig(**config))


def test_the_cbor_encoding_is_cbor2s_canonical_one():
    cbor2 = pytest.importorskip("cbor2")  # a test tool (requirements-dev.txt), not a runtime dependency
    rng = random.Random(7)
    bounds = [0, 23, 24, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, (1 << 64) - 1]
    for _ in range(200):
        ints = tuple(
            rng.choice([rng.choice(bounds), -rng.choice(bounds) - 1, rng.randrange(-(1 << 40), 1 << 40)])
            for _ in range(rng.randrange(0, 40))
        )
        extra = rng.choice([None, (("lora", "é" * rng.randrange(30), "/p"),), (("cache_salt", "s" * 300),)])
        value = (rng.randbytes(rng.choice([16, 32])), ints, extra)
        assert _cbor(value) == cbor2.dumps(value, canonical=True)


@pytest.mark.parametrize(
    "name, tokens",
    [
        ("sglang", [1, -1, 2, 3]),
        ("xxh64", [1, 2, 1 << 32, 3]),
        ("xxh3_64", [-5, 1, 2, 3]),
        ("sglang", [1, 1 << 63, 2, 3]),
    ],
)
def test_tokens_a_scheme_cannot_hash_are_invalid_naming_token_ids(name, tokens):
    scheme = scheme_from_config(KeySchemeConfig(name=name))
    with pytest.raises(InvalidArgumentError, match="'token_ids'"):
        request_keys([], tokens, scheme, 4, 100)


def test_request_keys_use_the_scheme_only_for_token_ids():
    scheme = scheme_from_config(KeySchemeConfig(name="sglang"))
    case = next(c for c in CASES if c["scheme"] == {"name": "sglang"})
    assert request_keys([], case["tokens"], scheme, case["block_size"], 100) == case["keys"]
    assert request_keys([7, 8], case["tokens"], scheme, case["block_size"], 100) == [7, 8]


def test_a_command_line_names_a_scheme_or_gives_its_json():
    assert scheme_from_text("") is ROLLING
    assert scheme_from_text("sglang").name == "sglang"
    case = next(c for c in CASES if c["scheme"].get("cache_salt"))
    assert scheme_from_text(json.dumps(case["scheme"])).keys(case["tokens"], 4) == case["keys"]
    for bad, field in (("md5", "key_scheme.name"), ("{not json", "key_scheme"), ('{"name": "vllm_xxhash"}', "seed")):
        with pytest.raises(InvalidArgumentError, match=field):
            scheme_from_text(bad)


def test_the_relay_recomputes_the_engines_keys_with_the_instances_scheme():
    case = next(c for c in CASES if c["scheme"] == {"name": "vllm_sha256", "seed": "0"} and c["block_size"] == 4)
    scheme = json.dumps(case["scheme"])
    config = RelayConfig("http://kvcm", "i1", "10.0.0.8:8080", keys="tokens", block_size=4, key_scheme=scheme)
    translator = Translator(config, RelayStats())
    tokens, engine = case["tokens"], [b"h0", b"h1"]
    first = translator.stored(BlockStored([engine[0]], None, tokens[:4], 4))
    second = translator.stored(BlockStored([engine[1]], engine[0], tokens[4:8], 4))  # chained on the parent
    assert [int(item["block_add"]["block_key"]) for item in first + second] == case["keys"]
    removed = translator.removed(BlockRemoved([engine[1]]))
    assert [int(item["block_delete"]["block_key"]) for item in removed] == case["keys"][1:]


def test_the_relay_refuses_a_bad_key_scheme_before_it_starts():
    from connectors.__main__ import main

    args = ["--endpoint", "tcp://127.0.0.1:1", "--manager", "http://kvcm", "--instance-id", "i1"]
    args += ["--host-ip-port", "10.0.0.8:8080", "--keys", "tokens", "--block-size", "4"]
    with pytest.raises(SystemExit, match="--key-scheme: field 'key_scheme.seed'"):
        main([*args, "--key-scheme", "vllm_xxhash"])
