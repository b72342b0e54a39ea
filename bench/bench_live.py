"""Live replay: a real trace through the HTTP API of the local stack, as a connector
drives KVCM, against the exact LRU curve of the same trace.

Per request of ``traces/mooncake_conversation.jsonl``: a prefix
getCacheLocation of its blocks, a startWriteCache of all of them, a finishWriteCache of
what was granted — sequentially, at full speed, into a group whose quota holds
``capacity`` blocks (watermark 0.9, LRU, the local reclaim schedule of one second, deletion
through the batched_delete state machine). Printed side by side per capacity:

- requests/s and the share of requests whose startWriteCache was refused;
- the live block hit ratio (hit blocks / requested blocks) against the exact prefix-aware
  LRU hit ratio at 0.9x and 1x the capacity (the optimizer's one-pass curve): a cache
  that reclaims to a 0.9 watermark should land between the two;
- server-side Valkey time per request (INFO commandstats: every command and script the
  request path and the background jobs ran, divided by the requests).

Targets (issue 9): refused <= 1 % of requests; live >= 0.97 x LRU(0.9 capacity) and
<= LRU(capacity).

    .venv/bin/python bench/bench_live.py [--requests N] [--capacities 5000,20000]
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from chalicelib.optimizer.mrc import CurveBuilder  # noqa: E402
from chalicelib.optimizer.traces import read_mooncake  # noqa: E402
from local_stack import LocalStack  # noqa: E402
from local_stack.config import StackConfig  # noqa: E402

TRACE = REPO / "traces" / "mooncake_conversation.jsonl"
BLOCK_BYTES = 2048  # two specs of 1 KiB: what the quota counts per block
TOKENS_PER_BLOCK = 512


class Connector:
    """An engine-side client on one keep-alive HTTP connection."""

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        self.host, self.port = parsed.hostname, parsed.port
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)

    def call(self, method: str, body: dict) -> dict:
        data = json.dumps(body)
        for attempt in range(2):
            try:
                self.conn.request("POST", f"/api/{method}", body=data, headers={"Content-Type": "application/json"})
                resp = self.conn.getresponse()
                return json.loads(resp.read())
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
                if attempt:
                    raise
        raise AssertionError("unreachable")


def _ok(resp: dict) -> bool:
    return resp["header"]["status"]["code"] == "OK"


def replay(stack: LocalStack, capacity: int, requests: list[list[int]]) -> dict:
    api = Connector(stack.api_url)
    group = f"live{capacity}"
    created = api.call(
        "createInstanceGroup",
        {
            "instance_group": {
                "name": group,
                "storage_candidates": ["nfs_01"],
                "quota": {"capacity": capacity * BLOCK_BYTES},
                "cache_config": {
                    "reclaim_strategy": {"reclaim_policy": "POLICY_LRU", "trigger_strategy": {"used_percentage": 0.9}}
                },
            }
        },
    )
    assert _ok(created), created
    instance = f"engine-{capacity}"
    registered = api.call(
        "registerInstance",
        {
            "instance_group": group,
            "instance_id": instance,
            "block_size": TOKENS_PER_BLOCK,
            "location_spec_infos": [{"name": "tp0", "size": 1024}, {"name": "tp1", "size": 1024}],
            "model_deployment": {"model_name": "bench", "dtype": "bf16"},
        },
    )
    assert _ok(registered), registered
    valkey = redis.Redis.from_url(stack.valkey_url)
    valkey.config_resetstat()
    hits = blocks = refused = 0
    reasons: dict[str, int] = {}
    began = time.perf_counter()
    for keys in requests:
        found = api.call(
            "getCacheLocation", {"instance_id": instance, "query_type": "QT_PREFIX_MATCH", "block_keys": keys}
        )
        hits += len(found.get("locations", []))
        blocks += len(keys)
        start = api.call("startWriteCache", {"instance_id": instance, "block_keys": keys})
        if not _ok(start):
            refused += 1
            reasons[start["header"]["status"]["message"][:80]] = (
                reasons.get(start["header"]["status"]["message"][:80], 0) + 1
            )
            continue
        finished = api.call(
            "finishWriteCache",
            {
                "instance_id": instance,
                "write_session_id": start["write_session_id"],
                "success_blocks": {"offset": len(start["locations"])},
            },
        )
        assert _ok(finished), finished
    elapsed = time.perf_counter() - began
    if reasons:
        print(f"  capacity {capacity}: refusals: " + "; ".join(f"{n} x {r}" for r, n in sorted(reasons.items())))
    stats = valkey.info("commandstats")
    commands = {
        k[len("cmdstat_") :]: v for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_config|resetstat")
    }
    valkey_us = sum(v["usec"] for v in commands.values())
    top = sorted(commands.items(), key=lambda kv: -kv[1]["usec"])[:6]
    print(
        f"  capacity {capacity}: Valkey time by command (µs per request, calls per request): "
        + ", ".join(f"{name} {v['usec'] / len(requests):.0f} ({v['calls'] / len(requests):.1f})" for name, v in top)
    )
    return {
        "requests_per_s": len(requests) / elapsed,
        "refused": refused / len(requests),
        "live_hit_ratio": hits / blocks,
        "valkey_us_per_request": valkey_us / len(requests),
    }


def lru_curve(count: int):
    """The exact prefix-aware LRU curve of the trace's first ``count`` requests."""
    builder = CurveBuilder(block_size=TOKENS_PER_BLOCK)
    for record in itertools.islice(read_mooncake(TRACE), count):
        builder.add(record)
    return builder.curve()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=0, help="replay only the first N requests (0: all)")
    parser.add_argument("--capacities", default="5000,20000", help="group capacities in blocks")
    args = parser.parse_args()
    requests = [[k + 1 for k in json.loads(line)["hash_ids"]] for line in TRACE.read_text().splitlines() if line]
    if args.requests:
        requests = requests[: args.requests]
    curve = lru_curve(len(requests))
    capacities = [int(c) for c in args.capacities.split(",")]
    print(f"live replay of {len(requests)} requests ({sum(map(len, requests))} blocks) of {TRACE.name}")
    print(
        f"{'capacity':>9} {'req/s':>7} {'refused':>8} {'live hit':>9} {'LRU 0.9x':>9} {'LRU 1x':>8} "
        f"{'live/LRU0.9':>11} {'Valkey µs/req':>14}  targets"
    )
    failed = False
    with tempfile.TemporaryDirectory() as state:
        with LocalStack(StackConfig(state_dir=Path(state), port=0, aws_port=0, snapshot_period_s=0)) as stack:
            for capacity in capacities:
                result = replay(stack, capacity, requests)
                low, high = curve.block_hit_ratio(int(capacity * 0.9)), curve.block_hit_ratio(capacity)
                live = result["live_hit_ratio"]
                ok = result["refused"] <= 0.01 and live >= 0.97 * low and live <= high
                failed |= not ok
                print(
                    f"{capacity:>9} {result['requests_per_s']:>7.1f} {result['refused']:>8.2%} {live:>9.4f} "
                    f"{low:>9.4f} {high:>8.4f} {live / low:>11.3f} {result['valkey_us_per_request']:>14.0f}  "
                    f"{'met' if ok else 'MISSED'}"
                )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
