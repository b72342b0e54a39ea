"""What durability costs a control-plane call on the local stack: the median latency of
addStorage and removeStorage through the HTTP API with the control-table journal on (every
write appended and fsync'd before moto answers) beside the same calls with it off (the
baseline: what the stack did before, a snapshot every few seconds), sampled in turns.

    .venv/bin/python bench/bench_local_durability.py [rounds]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from local_stack import LocalStack, StackConfig
from tests.e2e.harness import Api

PER_ROUND = 20


def timed_pairs(api: Api, data_dir: Path, tag: str, count: int) -> list[float]:
    """Seconds per call of ``count`` addStorage + removeStorage pairs."""
    samples = []
    for n in range(count):
        storage = {"global_unique_name": f"bench-{tag}-{n}", "nfs": {"root_path": str(data_dir / tag)}}
        for method, body in (
            ("addStorage", {"storage": storage}),
            ("removeStorage", {"storage_unique_name": storage["global_unique_name"]}),
        ):
            t0 = time.perf_counter()
            _, answer = api.call(method, body)
            samples.append(time.perf_counter() - t0)
            assert answer["header"]["status"]["code"] == "OK", answer
    return samples


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    with tempfile.TemporaryDirectory() as state:
        config = replace(StackConfig.from_env(), state_dir=Path(state), port=0, aws_port=0, snapshot_period_s=0)
        with LocalStack(config) as stack:
            api, journal = Api(stack.api_url), stack.snapshot
            timed_pairs(api, Path(state), "warmup", PER_ROUND)
            on, off = [], []
            for round_ in range(rounds):  # in turns: a machine that slows down moves both alike
                on += timed_pairs(api, Path(state), f"on{round_}", PER_ROUND)
                journal.detach()
                off += timed_pairs(api, Path(state), f"off{round_}", PER_ROUND)
                journal.attach()
            base, durable = statistics.median(off) * 1e3, statistics.median(on) * 1e3
            print(f"control-plane call latency over HTTP, median of {len(on)} calls each (addStorage/removeStorage)")
            print(f"  {'journal off (baseline: snapshot every few seconds)':<56} {base:>8.2f} ms")
            print(
                f"  {'journal on (fsync before the answer)':<56} {durable:>8.2f} ms"
                f"  (+{durable - base:.2f} ms, {durable / base:.2f}x)"
            )


if __name__ == "__main__":
    main()
