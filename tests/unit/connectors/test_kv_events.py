"""The relay's decoder and translation on the engines' golden payloads
(``tests/engines/golden/kv_events.json``, made by ``tests/engines/make_golden.py`` with
vLLM 0.33.0's and SGLang 0.5.23's own classes) and on the older positional forms."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from chalicelib.protocol.block_keys import keys_from_tokens
from connectors.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    MalformedBatchError,
    block_key,
    decode_batch,
    replay_frame,
)
from connectors.relay import RelayConfig, RelayStats, Translator, namespace_seed

GOLDEN = json.loads((Path(__file__).parents[2] / "engines" / "golden" / "kv_events.json").read_text())
FIELDS = {
    "BlockStored": set(BlockStored.__dataclass_fields__),
    "BlockRemoved": set(BlockRemoved.__dataclass_fields__),
    "AllBlocksCleared": set(),
}


def _value(v):
    if isinstance(v, dict) and set(v) == {"hex"}:
        return bytes.fromhex(v["hex"])
    if isinstance(v, list):
        return [_value(x) for x in v]
    return v


@pytest.mark.parametrize("case", GOLDEN, ids=[f"{c['engine']}: {c['name']}" for c in GOLDEN])
def test_golden_payloads_decode_to_the_engines_fields(case):
    batch = decode_batch(bytes.fromhex(case["payload_hex"]))
    assert batch.ts == case["ts"] and batch.data_parallel_rank == case["data_parallel_rank"] and not batch.unknown
    assert [type(e).__name__ for e in batch.events] == [e["type"] for e in case["events"]]
    for event, expected in zip(batch.events, case["events"], strict=True):
        for name in FIELDS[expected["type"]]:  # every field the decoder knows, as the engine set it
            if name in expected:
                assert _value(getattr(event, name)) == _value(expected[name]), name
            else:
                assert getattr(event, name) is None, name


def test_older_positional_forms_decode():
    six = ["BlockStored", [1], None, [0, 1, 2, 3], 4, None, "GPU"]
    seven = ["BlockStored", [2], 1, [4, 5, 6, 7], 4, 9, "CPU", "ad1"]
    batch = decode_batch(msgpack.packb([1.0, [six, seven, ["BlockRemoved", [1], "GPU"], ["AllBlocksCleared"]]]))
    stored6, stored7, removed, cleared = batch.events
    assert stored6 == BlockStored([1], None, [0, 1, 2, 3], 4, None, "GPU")
    assert stored7 == BlockStored([2], 1, [4, 5, 6, 7], 4, 9, "CPU", "ad1")
    assert removed == BlockRemoved([1], "GPU") and cleared == AllBlocksCleared()
    assert batch.data_parallel_rank is None
    # a batch map, SGLang's rank name, an unknown event type and unknown fields
    payload = msgpack.packb(
        {
            "ts": 2,
            "attn_dp_rank": 3,
            "events": [{"type": "BlockMoved", "x": 1}, {"type": "BlockRemoved", "block_hashes": [5], "future": [1]}],
        }
    )
    batch = decode_batch(payload)
    assert batch.data_parallel_rank == 3 and batch.unknown == ("BlockMoved",) and batch.events == [BlockRemoved([5])]


@pytest.mark.parametrize(
    ("payload", "names"),
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb([1.0]), "neither"),
        (msgpack.packb(["x", []]), "ts"),
        (msgpack.packb([1.0, {}]), "events"),
        (msgpack.packb([1.0, [], "r"]), "data_parallel_rank"),
        (msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [1]}]]), "block_size"),
        (
            msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": ["a"], "token_ids": [], "block_size": 4}]]),
            "block_hashes",
        ),
        (
            msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": ["a"], "block_size": 4}]]),
            "token_ids",
        ),
        (msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1], "medium": 5}]]), "medium"),
        (msgpack.packb([1.0, [["BlockRemoved", [1], "GPU", 0, 0]]]), "positional"),
        (msgpack.packb([1.0, [{"block_hashes": [1]}]]), "type"),
    ],
)
def test_malformed_payloads_are_refused_naming_what_is_wrong(payload, names):
    with pytest.raises(MalformedBatchError, match=names):
        decode_batch(payload)


def test_keys_are_the_low_64_bits_as_vllm_converts_them():
    digest = bytes(range(32))
    low = int.from_bytes(digest, "big") & (2**64 - 1)  # vllm.v1.core.kv_cache_utils.maybe_convert_block_hash
    assert block_key(digest) == low - 2**64 * (low >= 2**63) == block_key(low)
    assert (
        block_key(digest)
        == int.from_bytes(digest[-8:], "big", signed=True)
        != int.from_bytes(digest[:8], "big", signed=True)
    )
    assert block_key(2**64 - 1) == -1 and block_key(-5) == -5 and block_key(b"\x02") == 2
    with pytest.raises(MalformedBatchError):
        block_key("1")


def test_replay_frames_with_and_without_topic():
    seq = (7).to_bytes(8, "big")
    assert replay_frame([b"", b"kv", seq, b"p"]) == (7, b"p") == replay_frame([b"", seq, b"p"])
    assert replay_frame([b"", b"", (-1).to_bytes(8, "big", signed=True), b""])[0] == -1
    with pytest.raises(MalformedBatchError):
        replay_frame([b"", seq])


def _translator(**config):
    return Translator(RelayConfig(manager_url="", instance_id="e1", host_ip_port="h:1", **config), RelayStats())


def test_media_map_to_kvcm_media():
    config = RelayConfig(manager_url="", instance_id="e1", host_ip_port="h:1", media={"EXTERNAL": "", "HBM3": "hbm"})
    got = {
        m: config.kvcm_medium(m) for m in ("GPU", "CPU", "CPU_PINNED", "DISK", "STORAGE", "EXTERNAL", "hbm3", "NVME")
    }
    assert got == {
        "GPU": "gpu",
        "CPU": "mem",
        "CPU_PINNED": "mem",
        "DISK": "disk",
        "STORAGE": "disk",
        "EXTERNAL": "",
        "hbm3": "hbm",
        "NVME": "nvme",
    }
    assert config.kvcm_medium(None) == "gpu"
    translator = _translator(media={"EXTERNAL": ""})
    assert translator.stored(BlockStored([1], None, [0] * 4, 4, medium="EXTERNAL")) == []
    assert translator.stats.drops["medium not reported"] == 1
    assert "external" not in translator.mediums() and {"gpu", "mem", "disk"} <= set(translator.mediums())


def test_groups_are_selected_by_kind_or_index_and_never_chain_across():
    translator = _translator(keys="tokens", block_size=4)
    tokens = list(range(8))
    full = translator.stored(BlockStored([1, 2], None, tokens, 4, group_idx=0, kv_cache_spec_kind="full_attention"))
    window = translator.stored(BlockStored([1, 2], None, tokens, 4, group_idx=1, kv_cache_spec_kind="sliding_window"))
    assert len(full) == 2 and window == [] and translator.removed(BlockRemoved([1], group_idx=1)) == []
    assert translator.removed(BlockRemoved([7], group_idx=5)) == []  # a group never seen storing
    # group 2 is full attention too, but its parent hash 2 is group 0's: no chain across groups
    assert (
        translator.stored(BlockStored([3], 2, list(range(8, 12)), 4, group_idx=2, kv_cache_spec_kind="full_attention"))
        == []
    )
    assert translator.stats.keys_unchained == 1
    chained = translator.stored(
        BlockStored([3], 2, list(range(8, 12)), 4, group_idx=0, kv_cache_spec_kind="full_attention")
    )
    assert [int(i["block_add"]["block_key"]) for i in full + chained] == keys_from_tokens(list(range(12)), 4)
    by_index = _translator(groups=(1,))
    assert by_index.stored(BlockStored([1], None, [0] * 4, 4, group_idx=0, kv_cache_spec_kind="full_attention")) == []
    assert len(by_index.stored(BlockStored([1], None, [0] * 4, 4, group_idx=1, kv_cache_spec_kind="mamba"))) == 1


def test_namespace_seeds_separate_adapters_and_salts():
    seeds = {
        namespace_seed(lora, salt) for lora, salt in [("a", None), (None, "a"), ("a", "b"), ("ab", None), ("a", "")]
    }
    assert len(seeds) == 5 and 0 not in seeds and namespace_seed(None, None) == 0


def test_config_log_never_shows_the_token():
    shown = RelayConfig(manager_url="", instance_id="e1", host_ip_port="h:1", token="secret").described()
    assert shown["token"] == "set" and "secret" not in json.dumps(shown, default=str)
