"""Reclaim benchmark: the cost of one reclaim round against the number of blocks.

Each round frees the same 100 blocks' worth (``reclaim_step_size``) from one instance
whose blocks sit in prefix chains of 10, its buckets grown for it as starts grow them
(about 8 records each). The round samples, marks and hands victims to an inline
deleter, so the figures include the metadata deletion. Its cost must stay flat as the
instance grows: it follows the sample and the victims, not the total. Baseline: one full
scan of the instance, what a reclaimer without sampling reads before it can choose.

    .venv/bin/python bench/bench_reclaim.py
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import row, timeit_us, valkey_server
from chalicelib.clock import ManualClock
from chalicelib.index import BlockIndex
from tests.integration.capacity.harness import Cluster, counting_client, make_group, server_calls

SIZES = (10_000, 100_000, 300_000)
CHAIN = 10
STEP_BLOCKS = 100
ROUNDS = 30


def measure(blocks: int) -> dict:
    with valkey_server() as server:
        client, counting = counting_client(f"redis://127.0.0.1:{server.connection_pool.connection_kwargs['port']}/0")
        clock = ManualClock()
        cluster = Cluster(BlockIndex(client, "bench", clock), clock, rng=random.Random(1))
        ctx = cluster.add_instance("i1")
        cluster.bulk_chains("i1", count=blocks // CHAIN, length=CHAIN)
        # far over a 50 % watermark: every round frees one full step
        cluster.group = make_group(capacity_blocks=blocks, used_percentage=0.5, step_blocks=STEP_BLOCKS)
        reclaimer = cluster.reclaimer()
        reclaimer.run_round()  # loads the scripts
        client.config_resetstat()
        sends = counting.sends
        freed = []
        round_us = timeit_us(lambda: freed.append(reclaimer.run_round().victims), repeat=ROUNDS, warmup=0)
        trips = (counting.sends - sends) / ROUNDS
        commands = server_calls(client) / ROUNDS
        sends = counting.sends
        scan_us = timeit_us(lambda: sum(1 for _ in cluster.index.scan(ctx.layout)), repeat=2, warmup=0)
        scan_trips = (counting.sends - sends) / 2
        client.close()
    assert set(freed) == {STEP_BLOCKS}, freed
    return {
        "blocks": blocks,
        "buckets": cluster.index.bucket_count(ctx.layout),
        "round_ms": round_us / 1000,
        "trips": trips,
        "commands": commands,
        "victims": STEP_BLOCKS,
        "scan_ms": scan_us / 1000,
        "scan_trips": scan_trips,
    }


def main() -> None:
    results = [measure(n) for n in SIZES]
    print(f"reclaim round: {STEP_BLOCKS} blocks freed per round, chains of {CHAIN}, median of {ROUNDS} rounds")
    print(
        f"  {'blocks':>8} {'buckets':>8} {'ms/round':>9} {'trips/round':>12} {'cmds/round':>11}"
        f" {'victims':>8} | {'full scan ms':>12} {'scan trips':>10}"
    )
    for r in results:
        print(
            f"  {r['blocks']:>8,} {r['buckets']:>8,} {r['round_ms']:>9.2f} {r['trips']:>12.1f} {r['commands']:>11.0f}"
            f" {r['victims']:>8} | {r['scan_ms']:>12.1f} {r['scan_trips']:>10.0f}"
        )
    smallest = results[0]
    print("round time against the smallest instance, and against a full scan:")
    for r in results:
        print(row(f"{r['blocks']:,} blocks: one round", r["round_ms"], smallest["round_ms"], unit="ms"))
        print(row(f"{r['blocks']:,} blocks: one full scan (baseline)", r["scan_ms"], r["round_ms"], unit="ms"))


if __name__ == "__main__":
    main()
