"""Recovery of lost deletions against the number of instances.

With 10, 100 and 1,000 instances in one group (one block each) and one deletion lost in
the last of them (marked DELETING, never handed over), prints one recovery round
(``StrandedDeletions.recover``, past the deadline): wall time, Valkey commands and
Valkey time, beside the least a per-instance look costs measured in the same run (one
pipelined ZRANGEBYSCORE on every instance's pending set), and how many rounds the
former sweep (8 instances a round) needed to reach the last instance. Then what the
due registration adds to every mark: mark_deleting of 16 keys (then restored), p50,
beside one bare ZADD on the same key.

    .venv/bin/python bench/bench_stranded.py [--counts 10,100,1000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import timeit_us, valkey_server
from chalicelib.clock import ManualClock
from chalicelib.index import BlockIndex
from tests.integration.capacity.harness import BLOCK, Cluster, make_group

FORMER_INSTANCES_PER_ROUND = 8


def commands_and_us(client) -> tuple[int, float]:
    stats = client.info("commandstats")
    counted = [v for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_config|resetstat")]
    return sum(v["calls"] for v in counted), sum(v["usec"] for v in counted)


def measure(client, instances: int) -> dict[str, float]:
    client.flushall()
    clock = ManualClock()
    index = BlockIndex(client, "b", clock)
    cluster = Cluster(index, clock, rng=random.Random(1))
    cluster.group = make_group(capacity_blocks=10 * instances)
    for n in range(instances):
        cluster.add_instance(f"i{n:05}")
        cluster.write(f"i{n:05}", [n + 1])
    last = cluster.context(f"i{instances - 1:05}")
    index.mark_deleting(last.layout, [instances], [BLOCK])
    clock.advance(index.DELETION_LOST_AFTER_S + index.DUE_STEP_S)
    stranded = cluster.reclaimer().stranded

    client.config_resetstat()
    started = time.perf_counter()
    found = stranded.recover()
    wall_ms = (time.perf_counter() - started) * 1000
    commands, valkey_us = commands_and_us(client)
    assert found == 1 and cluster.statuses(last.instance_id) == {}

    layouts = [cluster.context(f"i{n:05}").layout for n in range(instances)]
    client.config_resetstat()
    started = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for layout in layouts:
        pipe.zrangebyscore(layout.key("pd"), "-inf", int(clock.now()), start=0, num=2048)
    pipe.execute()
    baseline_ms = (time.perf_counter() - started) * 1000
    baseline_commands, baseline_us = commands_and_us(client)
    return {
        "round_ms": wall_ms,
        "commands": commands,
        "valkey_us": valkey_us,
        "look_ms": baseline_ms,
        "look_commands": baseline_commands,
        "look_valkey_us": baseline_us,
        "former_rounds": -(-instances // FORMER_INSTANCES_PER_ROUND),
    }


def mark_cost(client, repeat: int = 2000) -> tuple[float, float]:
    """p50 µs of mark_deleting 16 keys (restored after each, untimed) and of one bare ZADD."""
    client.flushall()
    clock = ManualClock()
    index = BlockIndex(client, "b", clock)
    cluster = Cluster(index, clock, rng=random.Random(2))
    cluster.group = make_group(capacity_blocks=1000)
    layout = cluster.add_instance("i1").layout
    keys = list(range(1, 17))
    cluster.write("i1", keys)
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        victims = index.mark_deleting(layout, keys, [BLOCK])
        samples.append(time.perf_counter() - started)
        index.restore(layout, victims, [BLOCK])
    zadd = timeit_us(lambda: client.zadd("{b:deletions}:due", {"610:i1": 610}), repeat=repeat)
    return statistics.median(samples[200:]) * 1e6, zadd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", default="10,100,1000")
    counts = [int(c) for c in parser.parse_args().counts.split(",")]
    with valkey_server() as client:
        measure(client, 10)  # loads the scripts
        print(f"{'instances':>9}  {'recovery round':>30}  {'baseline: every-instance look':>32}  former sweep")
        print(
            f"{'':>9}  {'ms':>8} {'commands':>9} {'valkey us':>10}  {'ms':>8} {'commands':>9} {'valkey us':>12}  rounds"
        )
        for n in counts:
            m = measure(client, n)
            print(
                f"{n:>9}  {m['round_ms']:>8.2f} {m['commands']:>9} {m['valkey_us']:>10.0f}"
                f"  {m['look_ms']:>8.2f} {m['look_commands']:>9} {m['look_valkey_us']:>12.0f}  {m['former_rounds']}"
            )
        mark_us, zadd_us = mark_cost(client)
        print(
            f"mark_deleting of 16 keys: p50 {mark_us:.0f} us, of which the due registration (one ZADD) {zadd_us:.0f} us"
        )


if __name__ == "__main__":
    main()
