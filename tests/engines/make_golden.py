"""Writes ``tests/engines/golden/kv_events.json``: KV-event payloads encoded by the engines'
own classes (vLLM 0.33.0, SGLang 0.5.23, see ``loader.py``), each with the fields of the
events that made it, so the decoder's unit tests run without the wheels.

    .venv/bin/python -m tests.engines.make_golden

``tests/integration/engines/test_golden.py`` checks that the file is what this script makes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from tests.engines.loader import SGLANG_VERSION, VLLM_VERSION, load

GOLDEN = Path(__file__).with_name("golden") / "kv_events.json"


def _plain(value: Any) -> Any:
    """JSON of an event's fields: bytes as {"hex": ...}, tuples as lists."""
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _case(engine: str, version: str, name: str, batch: Any) -> dict[str, Any]:
    rank = getattr(batch, "data_parallel_rank", getattr(batch, "attn_dp_rank", None))
    return {
        "engine": f"{engine} {version}",
        "name": name,
        "payload_hex": msgspec.msgpack.encode(batch).hex(),
        "ts": batch.ts,
        "data_parallel_rank": rank,
        "events": [{"type": type(e).__name__, **_plain(msgspec.structs.asdict(e))} for e in batch.events],
    }


def cases() -> list[dict[str, Any]]:
    """Every golden case, built with the engines' classes."""
    v, s = load("vllm"), load("sglang")
    stored = {"parent_block_hash": None, "token_ids": list(range(8)), "block_size": 4, "lora_id": None}
    vllm_cases = {
        "int hashes, one group": [
            v.BlockStored(block_hashes=[1, 2**64 - 1], medium="GPU", lora_name=None, group_idx=0, **stored),
            v.BlockRemoved(block_hashes=[1], medium="GPU", group_idx=0),
            v.AllBlocksCleared(),
        ],
        "bytes hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)": [
            v.BlockStored(block_hashes=[bytes(range(32)), bytes(range(1, 33))], medium="GPU", lora_name=None, **stored),
        ],
        "hybrid groups, LoRA, extra keys": [
            v.BlockStored(
                block_hashes=[11, 12],
                medium="GPU",
                lora_name="ad1",
                extra_keys=[("ad1", ("img", 0)), ("ad1",)],
                group_idx=0,
                kv_cache_spec_kind="full_attention",
                locality="LOCAL",
                session_id="s1",
                lookahead_token_ids=[[8], [9]],
                **{**stored, "lora_id": 3},
            ),
            v.BlockStored(
                block_hashes=[11, 12],
                medium="CPU",
                lora_name="ad1",
                group_idx=1,
                kv_cache_spec_kind="sliding_window",
                kv_cache_spec_sliding_window=1024,
                ownership="tier-2",
                **stored,
            ),
            v.BlockRemoved(block_hashes=[11], medium="STORAGE", group_idx=1, locality="REMOTE"),
        ],
    }
    sglang_cases = {
        "cache salt, lora name, medium enum": [
            s.BlockStored(
                block_hashes=[21, -5],
                medium=s.StorageMedium.CPU,
                cache_salt="tenant-a",
                session_id="s2",
                lora_name="ad2",
                **stored,
            ),
            s.BlockRemoved(block_hashes=[21], medium=s.StorageMedium.DISK),
            s.AllBlocksCleared(),
        ],
        "defaults omitted": [s.BlockStored(block_hashes=[7], **stored), s.BlockRemoved(block_hashes=[7])],
    }
    out = [
        _case("vllm", VLLM_VERSION, name, v.KVEventBatch(ts=1.5, events=events, data_parallel_rank=0))
        for name, events in vllm_cases.items()
    ]
    out += [
        _case("sglang", SGLANG_VERSION, name, s.KVEventBatch(ts=2.5, events=events, attn_dp_rank=1))
        for name, events in sglang_cases.items()
    ]
    return out


def render() -> str:
    return json.dumps(cases(), indent=1) + "\n"


if __name__ == "__main__":
    GOLDEN.write_text(render())
    print(f"wrote {GOLDEN}")
