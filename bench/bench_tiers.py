"""One tier against two at equal storage cost, on the Mooncake conversation trace (issue 24).

    .venv/bin/python bench/bench_tiers.py [--budgets 2000,10000] [--model llama-3.1-8b]

For each budget (the storage cost of that many blocks of DRAM per hour), it prints:
* the baseline: the single-tier replay (``replay.replay``, LRU) of DRAM at that capacity;
* two-tier splits costing the same: half the budget in DRAM, the other half in S3 (or SSD)
  at the planner's default prices, under ``demote`` and ``write_through``, promotion on;
* per split the hit ratio per tier and in all, and the replay's speed (block accesses/s)
  beside the baseline's in the same run.

It also checks the simulation against the baseline: one tier alone equals the single-tier
replay exactly, and write-through equals the single-tier replay at the larger tier's capacity.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from chalicelib.optimizer.planner import GIB, build_plan  # noqa: E402
from chalicelib.optimizer.replay import ReplayConfig, replay  # noqa: E402
from chalicelib.optimizer.tiered import Strategy, TieredConfig, TierSpec, tier_storage, tiered_replay  # noqa: E402
from chalicelib.optimizer.traces import read_trace  # noqa: E402

TRACE = REPO_ROOT / "traces" / "mooncake_conversation.jsonl"
BLOCK = 512  # tokens per block of the Mooncake trace


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", default="2000,10000", help="DRAM blocks whose cost is each budget")
    parser.add_argument("--model", default="llama-3.1-8b", help="model preset: the block's bytes")
    parser.add_argument("--cold", default="s3,ssd", help="cold tiers to split with (planner tier names)")
    args = parser.parse_args()
    records = list(read_trace(str(TRACE), "mooncake"))
    accesses = sum(len(r.keys) for r in records)
    plan, _ = build_plan(block_size=BLOCK, model=args.model)
    gib = plan.block_bytes / GIB
    mem = tier_storage("mem")
    print(
        f"trace {TRACE.name}: {len(records):,} requests, {accesses:,} block accesses; "
        f"block {BLOCK} tokens = {gib * 1024:.0f} MiB ({args.model}); prices per GiB-hour: "
        + ", ".join(f"{t} {tier_storage(t).gib_hour_price:g}" for t in ["mem", *args.cold.split(",")])
    )
    print(
        f"{'budget/h':>9}  {'layout':<34}{'strategy':<14}{'hit':>8}{'in mem':>8}{'cold':>8}"
        f"{'replay s':>10}{'accesses/s':>12}"
    )
    for text in args.budgets.split(","):
        blocks = int(text)
        budget = blocks * gib * mem.gib_hour_price
        started = time.perf_counter()
        base = replay(records, ReplayConfig(capacity=blocks, block_size=BLOCK))
        base_s = time.perf_counter() - started
        started = time.perf_counter()
        alone = tiered_replay(records, TieredConfig((TierSpec("mem", blocks),), block_size=BLOCK))
        alone_s = time.perf_counter() - started
        assert alone.replay.totals == base.totals, "one tier must be the single-tier replay"
        ratio = base.totals.block_hit_ratio or 0.0
        print(
            f"{budget:>9.3f}  {f'mem {blocks:,} (single-tier replay)':<34}{'baseline':<14}{ratio:>8.2%}"
            f"{ratio:>8.2%}{'':>8}{base_s:>10.2f}{accesses / base_s:>12,.0f}"
        )
        print(
            f"{'':>9}  {f'mem {blocks:,} (tiered, one tier)':<34}{'-':<14}{ratio:>8.2%}"
            f"{ratio:>8.2%}{'':>8}{alone_s:>10.2f}{accesses / alone_s:>12,.0f}"
        )
        for cold in args.cold.split(","):
            price = tier_storage(cold).gib_hour_price
            hot = blocks // 2
            cold_blocks = int((budget - hot * gib * mem.gib_hour_price) / (gib * price))
            tiers = (TierSpec("mem", hot), TierSpec(cold, cold_blocks))
            for strategy in Strategy:
                started = time.perf_counter()
                result = tiered_replay(records, TieredConfig(tiers, strategy, block_size=BLOCK))
                elapsed = time.perf_counter() - started
                if strategy is Strategy.WRITE_THROUGH:
                    larger = replay(records, ReplayConfig(capacity=max(hot, cold_blocks), block_size=BLOCK))
                    assert result.replay.totals == larger.totals, "write-through must be the larger tier alone"
                hot_stats, cold_stats = result.tiers
                print(
                    f"{'':>9}  {f'mem {hot:,} + {cold} {cold_blocks:,}':<34}{strategy.value:<14}"
                    f"{result.hit_ratio or 0:>8.2%}{hot_stats.hit_ratio or 0:>8.2%}{cold_stats.hit_ratio or 0:>8.2%}"
                    f"{elapsed:>10.2f}{accesses / elapsed:>12,.0f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
