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
import collections
import itertools
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
from tests.engines.loader import VLLM_VERSION, engines_missing_reason, load, vllm_stored_batch  # noqa: E402

HOST = "10.0.0.8:8080"
TARGET_BLOCKS_S = 10_000
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
    """Samples the lag of every batch: every ``period_s`` it asks getHostCacheState for the
    first keys of the batches published and not yet seen, in publish order (one request:
    the host's prefix of them is how many leading batches are visible), and each batch seen
    gives one sample, from its publish call to the answer that first showed it."""

    #: Batches asked for at most per request (one chunk of ``visible``: its count is a prefix).
    MAX_KEYS = 1000

    def __init__(self, url: str, host: str, period_s: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.api, self.host, self.period_s = Connector(url), host, period_s
        self.unseen: collections.deque[tuple[int, float]] = collections.deque()  # (first key, publish time)
        self.lags: list[float] = []
        self.last_seen_at = float("nan")  # when the newest batch seen was first seen
        self.done = threading.Event()

    def published(self, first_key: int, at: float) -> None:
        self.unseen.append((first_key, at))

    def run(self) -> None:
        while not self.done.wait(self.period_s):
            asked = list(itertools.islice(self.unseen, self.MAX_KEYS))
            if not asked:
                continue
            seen = visible(self.api, [key for key, _ in asked], self.host)
            answered = time.perf_counter()
            for _ in range(seen):
                self.lags.append(answered - self.unseen.popleft()[1])
            if seen:
                self.last_seen_at = answered


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
        published = time.perf_counter()
        send(chunk)
        prober.published(chunk[0], published)
        keys += chunk
    return keys


def settle(api: Connector, keys: list[int], host: str, prober: Prober, timeout_s: float = 60) -> tuple[int, float]:
    """(keys visible, when the last batch was first seen) once the prober has seen every
    batch or ``timeout_s`` passed; then it stops."""
    deadline = time.perf_counter() + timeout_s
    while prober.unseen and time.perf_counter() < deadline:
        time.sleep(0.01)
    prober.done.set()
    prober.join()
    return visible(api, keys, host), prober.last_seen_at


def report(
    label: str, keys: list[int], began: float, sent_at: float, held: int, seen_at: float, lags: list[float]
) -> bool:
    """One row: sent/s, visible/s (every key, from the first publish to the last batch
    first seen), lost, lag p50 / p99 and the number of lag samples (one per batch)."""
    lags = sorted(lags) or [float("nan")]
    p50, p99 = statistics.median(lags), lags[min(len(lags) - 1, int(len(lags) * 0.99))]
    rate = len(keys) / (seen_at - began)
    ok = held == len(keys) and rate >= TARGET_BLOCKS_S * 0.98 and p99 <= 1.0
    print(
        f"{label:<34} {len(keys) / (sent_at - began):>10.0f} {rate:>12.0f} {len(keys) - held:>6} {p50 * 1000:>8.1f} "
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
            sent_at = time.perf_counter()
            held, seen_at = settle(api, keys, direct_host, prober)
            report("direct reportEvent (baseline)", keys, began, sent_at, held, seen_at, prober.lags)

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
                pub.publish(vllm_stored_batch(kv, chunk))

            prober = Prober(stack.api_url, HOST)
            prober.start()
            began = time.perf_counter()
            keys = paced(args.rate, args.batch, args.seconds, publish, prober, base=10**9)
            sent_at = time.perf_counter()
            held, seen_at = settle(api, keys, HOST, prober)
            met = report("vLLM publisher → relay → KVCM", keys, began, sent_at, held, seen_at, prober.lags)
            print("relay /metrics:", counters(health))
            relay.send_signal(signal.SIGTERM)
            relay.wait(30)
            pub.shutdown()
    print("target ≥ 10,000 blocks/s visible, 0 lost, p99 ≤ 1 s:", "met" if met else "MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
