"""The relay under load: vLLM 0.33.0's own ZmqEventPublisher at a fixed rate into the relay
and the local stack (its HTTP API, Valkey, moto), beside a same-run baseline of direct
reportEvent calls carrying the same blocks in the same batches.

For each run it prints the blocks/s sustained, the blocks lost (every published key is
looked up in getHostCacheState at the end), and the lag from publish to visible in
getHostCacheState: a prober thread asks for the newest published batch's first key until
it shows, and records how long that took (p50, p99 of those samples). The relay's lag is
measured the same way, from the engine's publish call. Target (issue #21): ≥ 10,000
blocks/s with zero loss and p99 ≤ 1 s.

    .venv/bin/python bench/bench_relay.py [--rate 10000] [--seconds 10] [--batch 100]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_live import Connector  # noqa: E402
from local_stack import LocalStack  # noqa: E402
from local_stack.config import StackConfig  # noqa: E402
from tests.engines.loader import VLLM_VERSION, engines_missing_reason, load  # noqa: E402

HOST = "10.0.0.8:8080"
L1P5 = "ST_EVENT_REPORT_L1P5"


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def counters(port: int) -> str:
    """The relay's non-zero counters, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    wanted = ("batches", "requests", "retries", "gaps", "drops", "errors", "lag")
    return ", ".join(
        line.replace("kvcm_relay_", "").replace('{dp_rank="0"}', "").replace('dp_rank="0",', "")
        for line in lines
        if not line.startswith("#") and any(w in line for w in wanted) and not line.endswith(" 0")
    )


def setup(api: Connector) -> None:
    """An event-report storage, a group using it, instance ``bench``."""
    calls = [
        (
            "addStorage",
            {
                "storage": {
                    "global_unique_name": "er_bench",
                    "storage_type": L1P5,
                    "event_report": {"heartbeat_timeout_ms": 600_000, "cleanup_grace_ms": 600_000},
                }
            },
        ),
        (
            "createInstanceGroup",
            {
                "instance_group": {
                    "name": "gbench",
                    "storage_candidates": ["nfs_01"],
                    "event_report_storage_candidates": ["er_bench"],
                }
            },
        ),
        (
            "registerInstance",
            {
                "instance_group": "gbench",
                "instance_id": "bench",
                "block_size": 16,
                "location_spec_infos": [{"name": "full_0", "size": 1024}],
                "model_deployment": {"model_name": "m", "dtype": "bf16"},
            },
        ),
    ]
    for method, body in calls:
        resp = api.call(method, body)
        assert resp["header"]["status"]["code"] == "OK", (method, resp)


def visible(api: Connector, keys: list[int], host: str) -> int:
    """How many of ``keys`` (a chunk at a time) ``host`` holds, as getHostCacheState says."""
    held = 0
    for start in range(0, len(keys), 1000):
        chunk = keys[start : start + 1000]
        resp = api.call(
            "getHostCacheState", {"instance_id": "bench", "query_type": "QT_PREFIX_MATCH", "block_cache_keys": chunk}
        )
        held += sum(int(h["local"]) for h in resp.get("hosts", []) if h["host_ip_port"] == host)
    return held


class Prober(threading.Thread):
    """Asks for the newest batch's first key until it is visible; one lag sample per batch seen."""

    def __init__(self, url: str, host: str) -> None:
        super().__init__(daemon=True)
        self.api, self.host = Connector(url), host
        self.latest: tuple[int, float] | None = None  # (first key, publish time)
        self.lags: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            target = self.latest
            if target is None:
                time.sleep(0.001)
                continue
            if visible(self.api, [target[0]], self.host):
                self.lags.append(time.perf_counter() - target[1])
                while self.latest is target and not self.done.is_set():
                    time.sleep(0.0005)


def paced(
    rate: float, batch: int, seconds: float, send: Callable[[list[int]], None], prober: Prober, base: int
) -> list[int]:
    """Calls ``send`` with batches of fresh keys at ``rate`` blocks/s; every key sent."""
    keys: list[int] = []
    interval = batch / rate
    began = time.perf_counter()
    n = int(rate * seconds / batch)
    for i in range(n):
        due = began + i * interval
        while (now := time.perf_counter()) < due:
            time.sleep(min(0.001, due - now))
        chunk = list(range(base + i * batch, base + (i + 1) * batch))
        send(chunk)
        prober.latest = (chunk[0], time.perf_counter())
        keys += chunk
    return keys


def settle(api: Connector, keys: list[int], host: str, timeout_s: float = 60) -> tuple[int, float]:
    """(keys visible, seconds waited) once all are visible or ``timeout_s`` passed."""
    began = time.perf_counter()
    while (held := visible(api, keys, host)) < len(keys) and time.perf_counter() - began < timeout_s:
        time.sleep(0.2)
    return held, time.perf_counter() - began


def report(label: str, keys: list[int], elapsed: float, held: int, tail_s: float, lags: list[float]) -> bool:
    lags = sorted(lags) or [float("nan")]
    p50, p99 = statistics.median(lags), lags[min(len(lags) - 1, int(len(lags) * 0.99))]
    rate = len(keys) / (elapsed + tail_s)
    ok = held == len(keys) and rate >= 10_000 * 0.98 and p99 <= 1.0
    print(
        f"{label:<34} {len(keys) / elapsed:>10.0f} {rate:>12.0f} {len(keys) - held:>6} {p50 * 1000:>8.1f} "
        f"{p99 * 1000:>8.1f} {len(lags):>7}"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rate", type=float, default=10_000, help="blocks/s published")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--batch", type=int, default=100, help="blocks per engine batch")
    args = parser.parse_args()
    if reason := engines_missing_reason():
        print(reason)
        return 2
    kv = load("vllm")
    print(
        f"{args.rate:.0f} blocks/s for {args.seconds:.0f} s in batches of {args.batch}; vLLM {VLLM_VERSION} publisher"
    )
    print(f"{'run':<34} {'sent/s':>10} {'visible/s':>12} {'lost':>6} {'p50 ms':>8} {'p99 ms':>8} {'samples':>7}")
    met = True
    with tempfile.TemporaryDirectory() as state:
        with LocalStack(StackConfig(state_dir=Path(state), port=0, aws_port=0, snapshot_period_s=0)) as stack:
            api = Connector(stack.api_url)
            setup(api)

            # baseline: the same batches as direct reportEvent calls (the relay's body, 1 request per batch)
            direct, direct_host = Connector(stack.api_url), "10.0.0.9:8080"
            body = {"instance_id": "bench", "host_ip_port": direct_host, "storage_type": L1P5}
            register = {"event_type": "EVENT_NODE_REGISTER", "node_register": {"mediums": ["gpu"]}}
            assert direct.call("reportEvent", {**body, "events": [register]})["header"]["status"]["code"] == "OK"

            def post(chunk: list[int]) -> None:
                items = [
                    {
                        "event_type": "EVENT_BLOCK_ADD",
                        "block_add": {
                            "block_key": str(k),
                            "medium": "gpu",
                            "specs": [{"name": "full_0", "uri": f"event_report://{direct_host}/gpu/{k}?spec=full_0"}],
                        },
                    }
                    for k in chunk
                ]
                resp = direct.call("reportEvent", {**body, "events": items})
                assert resp["header"]["status"]["code"] == "OK", resp

            prober = Prober(stack.api_url, direct_host)
            prober.start()
            began = time.perf_counter()
            keys = paced(args.rate, args.batch, args.seconds, post, prober, base=1)
            elapsed = time.perf_counter() - began
            held, tail = settle(api, keys, direct_host)
            prober.done.set()
            report("direct reportEvent (baseline)", keys, elapsed, held, tail, prober.lags)

            # the relay (its own process, as beside an engine): vLLM's publisher → ZMQ → relay → reportEvent
            pub = kv.ZmqEventPublisher(data_parallel_rank=0, endpoint="tcp://*:25557", replay_endpoint="tcp://*:25558")
            health = 25559
            relay = subprocess.Popen(
                [sys.executable, "-m", "connectors", "--endpoint", "tcp://127.0.0.1:25557"]
                + ["--replay-endpoint", "tcp://127.0.0.1:25558", "--manager", stack.api_url, "--instance-id", "bench"]
                + ["--host-ip-port", HOST, "--health-host", "127.0.0.1", "--health-port", str(health)]
                + ["--stats-s", "3600"],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            while not ready(health):
                time.sleep(0.05)

            def publish(chunk: list[int]) -> None:
                stored = kv.BlockStored(
                    block_hashes=chunk,
                    parent_block_hash=None,
                    token_ids=[0] * (16 * len(chunk)),
                    block_size=16,
                    lora_id=None,
                    medium="GPU",
                    lora_name=None,
                    group_idx=0,
                    kv_cache_spec_kind="full_attention",
                )
                pub.publish(kv.KVEventBatch(ts=time.time(), events=[stored]))

            prober = Prober(stack.api_url, HOST)
            prober.start()
            began = time.perf_counter()
            keys = paced(args.rate, args.batch, args.seconds, publish, prober, base=10**9)
            elapsed = time.perf_counter() - began
            held, tail = settle(api, keys, HOST)
            prober.done.set()
            met = report("vLLM publisher → relay → KVCM", keys, elapsed, held, tail, prober.lags)
            print("relay /metrics:", counters(health))
            relay.send_signal(signal.SIGTERM)
            relay.wait(30)
            pub.shutdown()
    print("target ≥ 10,000 blocks/s visible, 0 lost, p99 ≤ 1 s:", "met" if met else "MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
